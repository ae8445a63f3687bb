"""Hugging Face checkpoint names of the MoE architectures, mapped to GGUF's layout.

HF stores experts one by one (``mlp.experts.E.{gate,up,down}_proj.weight``) or, since
transformers 5, fused per layer (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``);
GGUF stacks them per layer (``blk.N.ffn_{gate,up,down}_exps.weight``). Mixtral checkpoints
name the same things ``block_sparse_moe.gate`` and ``block_sparse_moe.experts.E.w1/w3/w2``
(gate/up/down); :func:`qwen_moe_name` maps them onto the names above.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.names import stacked_experts_from_hf
from tessera.errors import ModelFileError
from tessera.models.llama.config import HF_NAMES as LLAMA_HF_NAMES

HF_SHARED_NAMES = {
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
}


def _vector(value: Any, c: Any) -> np.ndarray:
    return np.asarray(value).reshape(-1)  # (1, n_embd) in HF, a vector in GGUF


#: The llama family's names plus the router (Mixtral's under its own name) and the shared
#: expert; the routed experts are many HF tensors to one GGUF tensor (stacked_experts).
HF_NAMES = attrs.evolve(
    LLAMA_HF_NAMES,
    layer_names={
        **LLAMA_HF_NAMES.layer_names,
        **HF_SHARED_NAMES,
        "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    },
    transforms={**LLAMA_HF_NAMES.transforms, "ffn_gate_inp_shexp.weight": _vector},
)


#: Mixtral's per-expert projections -> the Qwen MoE names.
MIXTRAL_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def qwen_moe_name(rest: str) -> str:
    """A layer tensor name (after ``model.layers.N.``) in the Qwen MoE form: Mixtral's
    ``block_sparse_moe.*`` names are renamed, every other name is returned as it is."""
    if not rest.startswith("block_sparse_moe."):
        return rest
    parts = rest.removeprefix("block_sparse_moe.").split(".")
    if parts[0] == "experts" and len(parts) == 4 and parts[2] in MIXTRAL_EXPERT_NAMES:
        parts[2] = MIXTRAL_EXPERT_NAMES[parts[2]]
    return ".".join(["mlp", *parts])


class Subset(Mapping):
    """The HF tensors named in ``names``, still read lazily."""

    def __init__(self, tensors: Mapping[str, Any], names: dict[str, str]) -> None:
        self.tensors, self.names = tensors, names

    def __getitem__(self, name: str) -> Any:
        return self.tensors[self.names[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def stacked_experts(
    c: Any, layer: int, names: dict[str, str], hf: Mapping[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """GGUF's stacked expert tensors of ``layer`` (config ``c``: n_expert, n_ff_exp, arch)
    from HF's per-expert or fused (transformers 5) tensors named in ``names``."""
    yield from stacked_experts_from_hf(c, layer, names, hf, c.arch)
    unknown = [n for n in names.values() if ".experts." not in n]
    if unknown:
        raise ModelFileError(
            f"unexpected tensor '{unknown[0]}' in a {c.arch} checkpoint; the {c.arch} "
            "architecture plugin does not know where it goes"
        )

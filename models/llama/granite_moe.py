"""IBM Granite 3 mixture-of-experts models (HF ``granitemoe``, GGUF ``granitemoe``): the
Granite block's multipliers (:mod:`tessera.models.llama.granite`) around routed experts as
wide as the dense FFN, the top-k renormalized (softmax over the chosen experts' logits).

HF checkpoints store each layer's experts fused, ``block_sparse_moe.input_linear`` (gate
rows, then up rows, per expert) and ``output_linear``, and the router as
``block_sparse_moe.router.layer``; they are renamed onto the names the MoE code maps
(:mod:`tessera.models.llama.moe_hf`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tessera.hookspecs import hookimpl
from tessera.models.llama.granite import EXAMPLE_SCALES
from tessera.models.llama.moe import MoEArchitecture
from tessera.models.llama.moe_config import MoEConfig
from tessera.models.llama.moe_hf import Subset

TESSERA_PLUGIN_API = 2

#: Granite's MoE tensor names (after ``model.layers.N.``) -> the names ``moe_hf`` maps.
GRANITE_MOE_NAMES = {
    "block_sparse_moe.input_linear.weight": "mlp.experts.gate_up_proj",
    "block_sparse_moe.experts.gate_up_proj": "mlp.experts.gate_up_proj",
    "block_sparse_moe.output_linear.weight": "mlp.experts.down_proj",
    "block_sparse_moe.experts.down_proj": "mlp.experts.down_proj",
    "block_sparse_moe.router.layer.weight": "mlp.gate.weight",
    "block_sparse_moe.router.weight": "mlp.gate.weight",
}


def _moe_name(hf_name: str) -> str:
    layer, _, rest = hf_name.removeprefix("model.layers.").partition(".")
    if hf_name.startswith("model.layers.") and rest in GRANITE_MOE_NAMES:
        return f"model.layers.{layer}.{GRANITE_MOE_NAMES[rest]}"
    return hf_name


class GraniteMoEArchitecture(MoEArchitecture):
    names = ("granitemoe",)
    hf_model_types = ("granitemoe",)

    def variant(self, config: MoEConfig) -> MoEArchitecture:
        return self

    def tensors_from_hf(
        self, c: MoEConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        renamed = {_moe_name(name): name for name in hf_tensors}
        yield from super().tensors_from_hf(c, Subset(hf_tensors, renamed), for_gguf)

    def example_config(self, **overrides: Any) -> MoEConfig:
        return super().example_config(**({"arch": "granitemoe"} | EXAMPLE_SCALES | overrides))


@hookimpl
def tessera_register_architectures(register):
    register(GraniteMoEArchitecture())

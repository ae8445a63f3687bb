"""gpt-oss's Hugging Face tensors in GGUF's layout, as llama.cpp's converter lays them out.

transformers keeps each layer's experts fused: ``mlp.experts.gate_up_proj`` ``(E, n_embd,
2F)`` with gate and up columns interleaved (gate the even ones), ``down_proj`` ``(E, F,
n_embd)``, both ``(in, out)``, and their biases; GGUF stacks ``(E, out, in)`` matrices per
projection (``ffn_{gate,up,down}_exps``) and their bias rows. OpenAI's checkpoints store
those projections in MXFP4 (``*_blocks`` / ``*_scales``, rows of the ``(E, out, in)``
matrices); they are decoded here to float32, exactly (every MXFP4 value is a float32).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.names import TensorNames, tensors_from_hf
from tessera.errors import ModelFileError

HF_NAMES = TensorNames(
    global_names={
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        **{
            f"self_attn.{hf}_proj.{kind}": f"attn_{gguf}.{kind}"
            for hf, gguf in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
            for kind in ("weight", "bias")
        },
        "self_attn.sinks": "attn_sinks.weight",
        "mlp.router.weight": "ffn_gate_inp.weight",
        "mlp.router.bias": "ffn_gate_inp.bias",
    },
    checkpoint="a gpt-oss",
    plugin="gpt-oss architecture",
    skip_suffixes=("rotary_emb.inv_freq",),
)
EXPERTS = "mlp.experts."
#: E2M1 values by code (OpenAI's and GGML's order: codes 8..15 are the negatives of 0..7).
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def openai_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Float32 ``(..., rows, cols)`` from OpenAI's MXFP4: ``blocks`` ``(..., rows, cols / 32,
    16)`` uint8 hold two codes per byte, value ``2k`` in the low nibble and ``2k + 1`` in
    the high one; ``scales`` ``(..., rows, cols / 32)`` are E8M0 exponents (``2**(s - 127)``)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    exponent = scales.astype(np.int32)[..., None] - 127
    values = np.ldexp(FP4_VALUES[codes], exponent).astype(np.float32)
    return values.reshape(*values.shape[:-2], -1)


class _Only(Mapping):
    """The tensors of ``tensors`` named in ``names``, still read lazily."""

    def __init__(self, tensors: Mapping[str, Any], names: list[str]) -> None:
        self.tensors, self.names = tensors, names

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _part(parts: Mapping[str, str], hf: Mapping[str, Any], part: str, layer: int) -> np.ndarray:
    if part not in parts:
        raise ModelFileError(
            f"layer {layer} of this gpt-oss checkpoint lacks mlp.experts.{part}; the checkpoint "
            "is incomplete"
        )
    return np.asarray(hf[parts[part]])


def _matrices(parts: Mapping[str, str], hf: Mapping[str, Any], proj: str, layer: int) -> Any:
    """One fused projection as ``(E, out, in)`` float32: from MXFP4 blocks or a plain
    ``(E, in, out)`` parameter."""
    if proj + "_blocks" in parts:
        blocks = _part(parts, hf, proj + "_blocks", layer)
        return openai_mxfp4(blocks, _part(parts, hf, proj + "_scales", layer))
    return np.swapaxes(_part(parts, hf, proj, layer).astype(np.float32), 1, 2)


def _expert_tensors(
    layer: int, parts: Mapping[str, str], hf: Mapping[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    p = f"blk.{layer}."
    gate_up = _matrices(parts, hf, "gate_up_proj", layer)  # rows: gate, up, gate, up ...
    yield p + "ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, 0::2])
    yield p + "ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, 1::2])
    yield p + "ffn_down_exps.weight", np.ascontiguousarray(_matrices(parts, hf, "down_proj", layer))
    gate_up_bias = _part(parts, hf, "gate_up_proj_bias", layer).astype(np.float32)
    yield p + "ffn_gate_exps.bias", np.ascontiguousarray(gate_up_bias[:, 0::2])
    yield p + "ffn_up_exps.bias", np.ascontiguousarray(gate_up_bias[:, 1::2])
    yield p + "ffn_down_exps.bias", _part(parts, hf, "down_proj_bias", layer).astype(np.float32)


def gpt_oss_tensors(hf: Mapping[str, Any], for_gguf: bool) -> Iterator[tuple[str, Any]]:
    """``(gguf_name, value)`` of every tensor of an HF gpt-oss checkpoint."""
    experts: dict[int, dict[str, str]] = {}
    plain = []
    for name in hf:
        layer, _, rest = name.removeprefix(HF_NAMES.layer_prefix).partition(".")
        if name.startswith(HF_NAMES.layer_prefix) and rest.startswith(EXPERTS):
            experts.setdefault(int(layer), {})[rest[len(EXPERTS) :]] = name
        else:
            plain.append(name)
    yield from tensors_from_hf(HF_NAMES, None, _Only(hf, plain), for_gguf)
    for layer, parts in sorted(experts.items()):
        yield from _expert_tensors(layer, parts, hf)

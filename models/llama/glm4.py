"""GLM-4-0414 (HF ``glm4``, GGUF ``glm4``): a llama-family block with a norm before and
after attention and before and after the FFN (``attn_norm`` / ``post_attention_norm``,
``ffn_norm`` / ``post_ffw_norm``; each post-norm on its branch before the residual add),
Q/K/V biases, one ``ffn_up`` tensor of gate rows then up rows, and RoPE over half of
each head (``rope.dimension_count``; HF ``partial_rotary_factor``, 0.5 when unstated).
transformers turns adjacent pairs, as GGML's normal mode does, so llama.cpp's converter
leaves Q/K unpermuted and HF folders rotate in normal mode too.

GLM-4.5 (the MoE models) is :mod:`tessera.models.llama.glm4_moe`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import HF_NAMES, LlamaConfig

TESSERA_PLUGIN_API = 2
#: transformers' GLM configs rotate half of each head unless they say otherwise.
PARTIAL_ROTARY = 0.5

#: GLM-4's four norms under llama.cpp's names, and the fused gate/up rows.
GLM4_HF_NAMES = attrs.evolve(
    HF_NAMES,
    layer_names={
        **HF_NAMES.layer_names,
        "post_self_attn_layernorm.weight": "post_attention_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "post_mlp_layernorm.weight": "post_ffw_norm.weight",
        "mlp.gate_up_proj.weight": "ffn_up.weight",
    },
    checkpoint="a glm4",
)


def partial_rotary_dims(hf: Mapping[str, Any], head_dim: int) -> int:
    """The rotated values per head of a GLM ``config.json``."""
    rope = hf.get("rope_parameters") or {}
    part = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", PARTIAL_ROTARY))
    return int(head_dim * float(part))


class Glm4Architecture(LlamaArchitecture):
    names = ("glm4",)
    hf_model_types = ("glm4",)
    hf_names = GLM4_HF_NAMES

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        return {"n_rot": partial_rotary_dims(hf, fields["head_dim"])}

    def example_config(self, **overrides: Any) -> LlamaConfig:
        head_dim = overrides.get("n_embd", 64) // overrides.get("n_head", 4)
        return super().example_config(**({"n_rot": head_dim // 2} | overrides))


@hookimpl
def tessera_register_architectures(register):
    register(Glm4Architecture())

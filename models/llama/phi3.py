"""Phi-3 and Phi-4-mini (HF ``phi3``, GGUF ``phi3``): a llama-family block with fused
tensors, ``attn_qkv`` (Q rows, then K, then V) and ``ffn_up`` (gate rows, then up rows),
NeoX RoPE over ``rope.dimension_count`` values of each head (Phi-4-mini rotates three
quarters) and LongRoPE as GGUF stores it: ``rope_factors_short``/``rope_factors_long``
divisors chosen by context size and ``rope.scaling.attn_factor``.

Phi-3 mini's sliding window (``attention.sliding_window``) is applied, as transformers
applies it; llama.cpp reads the key but attends to the whole context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import PHI3_HF_NAMES, LlamaConfig
from tessera.models.llama.rope import RopeScaling

TESSERA_PLUGIN_API = 2


class Phi3Architecture(LlamaArchitecture):
    names = ("phi3",)
    hf_model_types = ("phi3",)
    hf_names = PHI3_HF_NAMES

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        part = float(rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0)
        return {
            "n_swa": int(hf.get("sliding_window") or 0),
            "n_rot": int(fields["head_dim"] * part),
        }

    def gguf_metadata(self, c: LlamaConfig) -> dict[str, Any]:
        # llama.cpp's converter states the window always, 0 for none (Phi-4)
        return super().gguf_metadata(c) | {"phi3.attention.sliding_window": c.n_swa}

    def example_config(self, **overrides: Any) -> LlamaConfig:
        # Phi-4-mini's parts: LongRoPE over three quarters of each head (the kit's
        # contexts are longer than the original one: the long factors), a sliding window
        head_dim = overrides.get("n_embd", 64) // overrides.get("n_head", 4)
        scaling = RopeScaling(kind="longrope", n_ctx_orig=16, attn_factor=1.2, factors="longrope")
        parts = {"n_rot": head_dim * 3 // 4, "rope_scaling": scaling, "n_swa": 6}
        return super().example_config(**(parts | overrides))


@hookimpl
def tessera_register_architectures(register):
    register(Phi3Architecture())

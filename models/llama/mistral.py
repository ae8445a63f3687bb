"""The Mistral members of the llama family.

- Mistral 7B and its kind (HF ``mistral``): Llama with, in v0.1-style configs, a sliding
  window over every layer. llama.cpp writes them as ``llama`` files and its converter
  drops the window (llama.cpp attends to the whole context); ``tessera convert`` keeps it
  as ``llama.attention.sliding_window``, which the llama plugin then reads.
- Ministral 3 (HF ``ministral3``, GGUF ``mistral3``): YaRN RoPE and an attention
  temperature, Q scaled by ``1 + beta ln(1 + floor(pos / n_ctx_orig))`` (HF
  ``llama_4_scaling_beta``, GGUF ``attention.temperature_scale``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import LlamaConfig
from tessera.models.llama.rope import RopeScaling

TESSERA_PLUGIN_API = 2


class MistralArchitecture(LlamaArchitecture):
    names = ("mistral3",)
    hf_model_types = ("mistral", "ministral3")
    gguf_arch = {"mistral": "llama", "ministral3": "mistral3"}

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"n_swa": int(hf.get("sliding_window") or 0)}
        if hf["model_type"] == "ministral3":
            rope = hf.get("rope_parameters") or {}
            out["attn_temp_scale"] = float(rope.get("llama_4_scaling_beta") or 0.0)
        return out

    def example_config(self, **overrides: Any) -> LlamaConfig:
        # Ministral 3's parts: YaRN over a short original context, the temperature
        scaling = RopeScaling(kind="yarn", n_ctx_orig=4, yarn_log_mul=1.0)
        parts = {"rope_freq_scale": 0.25, "rope_scaling": scaling, "attn_temp_scale": 0.1}
        return super().example_config(**(parts | overrides))


@hookimpl
def tessera_register_architectures(register):
    register(MistralArchitecture())

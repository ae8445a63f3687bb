"""IBM Granite 3 dense models (HF ``granite``, GGUF ``granite``): Llama with four
multipliers, read from llama.cpp's ``embedding_scale``, ``residual_scale``,
``attention.scale`` and ``logit_scale`` keys (HF ``embedding_multiplier``,
``residual_multiplier``, ``attention_multiplier``, ``logits_scaling``): the token
embeddings and both residual branches are scaled, attention scores use the given scale
instead of ``1/sqrt(head_dim)``, and the logits are divided. The MoE models are
:mod:`tessera.models.llama.granite_moe`.
"""

from __future__ import annotations

from typing import Any

from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import LlamaConfig

TESSERA_PLUGIN_API = 2
#: A test model's multipliers, each away from its neutral value (Granite 3.3 2B's are
#: 12, 0.22, 0.0078125 and 8).
EXAMPLE_SCALES = {
    "embedding_scale": 12.0,
    "residual_scale": 0.22,
    "attention_scale": 0.1,
    "logit_scale": 8.0,
}


class GraniteArchitecture(LlamaArchitecture):
    names = ("granite",)
    hf_model_types = ("granite",)

    def example_config(self, **overrides: Any) -> LlamaConfig:
        return super().example_config(**(EXAMPLE_SCALES | overrides))


@hookimpl
def tessera_register_architectures(register):
    register(GraniteArchitecture())

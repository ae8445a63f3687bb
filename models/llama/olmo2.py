"""OLMo 2 (HF ``olmo2``, GGUF ``olmo2``): a llama-family block whose two RMSNorms follow
attention and the FFN (``post_attention_norm``, ``post_ffw_norm``, applied to each branch
before its residual add) instead of preceding them, with Q and K normalized over the whole
projection (``attn_q_norm`` of ``n_head * head_dim`` values) before RoPE; NeoX RoPE, no
tied embeddings. OLMo 3's sliding-window layers (llama.cpp writes them as ``olmo2`` with
``attention.sliding_window``) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import OLMO2_HF_NAMES, LlamaConfig

TESSERA_PLUGIN_API = 2


class Olmo2Architecture(LlamaArchitecture):
    names = ("olmo2",)
    hf_model_types = ("olmo2",)
    hf_names = OLMO2_HF_NAMES

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> LlamaConfig:
        if metadata.get("olmo2.attention.sliding_window"):
            raise ModelFileError(
                "this olmo2 file has sliding-window layers (OLMo 3), which the olmo2 plugin "
                "does not run yet; use an OLMo 2 model"
            )
        return super().config_from_gguf(metadata, tensor_shapes)


@hookimpl
def tessera_register_architectures(register):
    register(Olmo2Architecture())

"""The ``gemma2`` architecture: Gemma 2 text models (2B, 9B, 27B), as llama.cpp runs them.

Every other layer slides (llama.cpp's pattern of period 2: layer 0 slides, layer 1 is
global), attention scores and final logits are soft-capped (GGUF
``gemma2.attn_logit_softcapping`` and ``gemma2.final_logit_softcapping``, 50 and 30 when a
file states neither, as in llama.cpp) and all layers share one RoPE. The shared parts are in
:mod:`tessera.models.gemma.arch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.contract.names import (
    ConfigField,
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
)
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.gemma.arch import GemmaArchitecture
from tessera.models.gemma.config import (
    COMMON_FIELDS,
    GemmaConfig,
    attn_scalar_from_gguf,
    attn_scalar_to_gguf,
    rope_from_hf,
    rope_scale_from_gguf,
    rope_scale_to_gguf,
    swa_layers_from_gguf,
    swa_layers_from_hf,
    swa_layers_to_gguf,
)

TESSERA_PLUGIN_API = 2

ARCH = "gemma2"
PATTERN = 2
CONFIG_FIELDS = (
    *COMMON_FIELDS,
    # config.json null means "none": no window, no cap (transformers skips them)
    ConfigField("n_swa", "attention.sliding_window", "sliding_window", default=4096, hf_default=0),
    ConfigField(
        "attn_softcap", "attn_logit_softcapping", "attn_logit_softcapping", float, 50.0, 0.0
    ),
    ConfigField(
        "final_softcap", "final_logit_softcapping", "final_logit_softcapping", float, 30.0, 0.0
    ),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 10000.0),
)


class Gemma2Architecture(GemmaArchitecture):
    names = (ARCH,)
    hf_model_types = (ARCH,)
    default_pattern = PATTERN

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> GemmaConfig:
        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, ARCH))
        scale = rope_scale_from_gguf(metadata, ARCH)
        return GemmaConfig(
            **fields,
            arch=ARCH,
            n_vocab=int(tensor_shapes["token_embd.weight"][0]),
            swa_layers=swa_layers_from_gguf(metadata, ARCH, fields["n_layer"], PATTERN),
            query_pre_attn_scalar=attn_scalar_from_gguf(metadata, ARCH, fields),
            rope_freq_scale=scale,
            # sliding layers take the global RoPE unless the file gives them a base
            rope_freq_base_swa=float(
                metadata.get(f"{ARCH}.rope.freq_base_swa", fields["rope_freq_base"])
            ),
            rope_freq_scale_swa=scale,
            tied_embeddings="output.weight" not in tensor_shapes,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> GemmaConfig:
        if hf.get("use_bidirectional_attention"):
            raise ModelFileError(
                "this Gemma 2 model attends in both directions (an encoder), which the gemma2 "
                "plugin does not run; use a causal Gemma 2 language model"
            )
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        base, scale = rope_from_hf(rope, float(hf.get("rope_theta", 10000.0)), ARCH)
        return GemmaConfig(
            **default_head_dims(fields_from_hf(CONFIG_FIELDS, hf)),
            arch=ARCH,
            swa_layers=swa_layers_from_hf(hf, PATTERN),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            rope_freq_base=base,
            rope_freq_scale=scale,
            rope_freq_base_swa=base,
            rope_freq_scale_swa=scale,
        )

    def gguf_metadata(self, c: GemmaConfig) -> dict[str, Any]:
        meta = {"general.architecture": ARCH, **fields_to_gguf(CONFIG_FIELDS, c, ARCH)}
        if c.rope_freq_base_swa != c.rope_freq_base:
            meta[f"{ARCH}.rope.freq_base_swa"] = c.rope_freq_base_swa
        return (
            meta | swa_layers_to_gguf(c, PATTERN) | attn_scalar_to_gguf(c) | rope_scale_to_gguf(c)
        )

    def example_fields(self) -> dict[str, Any]:
        return {"attn_softcap": 50.0, "final_softcap": 30.0}


@hookimpl
def tessera_register_architectures(register):
    register(Gemma2Architecture())

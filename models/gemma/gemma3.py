"""The ``gemma3`` architecture: Gemma 3 text models (``Gemma3ForCausalLM``: 270M, 1B, and the
text part of 4B-27B), as llama.cpp runs them.

Q and K are RMS-normalized per head; five of every six layers slide (llama.cpp's pattern of
period 6, used when GGUF gives ``gemma3.attention.sliding_window`` and no pattern; without a
window every layer is global). Sliding layers rotate with ``gemma3.rope.freq_base_swa``
(10000 when absent) and no scaling; global layers with ``gemma3.rope.freq_base`` and the
file's linear scaling (factor 8 in the 4B+ models). No attention cap; the final-logit cap
only where the file states one. The shared parts are in :mod:`tessera.models.gemma.arch`.
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

ARCH = "gemma3"
PATTERN = 6
CONFIG_FIELDS = (
    *COMMON_FIELDS,
    ConfigField(
        "final_softcap",
        "final_logit_softcapping",
        "final_logit_softcapping",
        float,
        0.0,
        omit_default=True,
    ),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 10000.0),
    ConfigField("rope_freq_base_swa", "rope.freq_base_swa", (), float, 10000.0),
)


class Gemma3Architecture(GemmaArchitecture):
    names = (ARCH,)
    # config.json's model_type (gemma3_text) also names EmbeddingGemma, which the
    # gemma-embedding plugin loads: the class name tells them apart
    hf_classes = ("Gemma3ForCausalLM",)
    default_pattern = PATTERN

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> GemmaConfig:
        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, ARCH))
        n_layer = fields["n_layer"]
        n_swa = int(metadata.get(f"{ARCH}.attention.sliding_window") or 0)
        swa = (
            swa_layers_from_gguf(metadata, ARCH, n_layer, PATTERN) if n_swa else (False,) * n_layer
        )
        return GemmaConfig(
            **fields,
            arch=ARCH,
            n_vocab=int(tensor_shapes["token_embd.weight"][0]),
            swa_layers=swa,
            n_swa=n_swa,
            query_pre_attn_scalar=attn_scalar_from_gguf(metadata, ARCH, fields),
            rope_freq_scale=rope_scale_from_gguf(metadata, ARCH),
            qk_norm=True,
            tied_embeddings="output.weight" not in tensor_shapes,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> GemmaConfig:
        if hf.get("use_bidirectional_attention"):
            raise ModelFileError(
                "this Gemma 3 model attends in both directions (EmbeddingGemma); the "
                "gemma-embedding plugin runs it, the gemma3 plugin runs language models"
            )
        if hf.get("attn_logit_softcapping") is not None:
            raise ModelFileError(
                "this Gemma 3 config caps attention scores, which llama.cpp's gemma3 does not "
                "do and GGUF cannot state; it is not supported"
            )
        rope = dict(hf.get("rope_parameters") or {})
        full = rope.get("full_attention", hf.get("rope_scaling") or rope)
        base, scale = rope_from_hf(full, float(hf.get("rope_theta", 1_000_000.0)), ARCH)
        local = rope.get("sliding_attention") or {}
        base_swa, scale_swa = rope_from_hf(
            local, float(hf.get("rope_local_base_freq", 10000.0)), ARCH
        )
        if scale_swa != 1.0:
            raise ModelFileError(
                "this Gemma 3 config scales the sliding layers' RoPE, which llama.cpp's gemma3 "
                "does not do and GGUF cannot state; it is not supported"
            )
        fields = default_head_dims(fields_from_hf(CONFIG_FIELDS, hf))
        n_swa = int(hf.get("sliding_window") or 0)
        n_layer = fields["n_layer"]
        return GemmaConfig(
            **fields,
            arch=ARCH,
            swa_layers=swa_layers_from_hf(hf, PATTERN) if n_swa else (False,) * n_layer,
            n_swa=n_swa,
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            rope_freq_base=base,
            rope_freq_scale=scale,
            rope_freq_base_swa=base_swa,
            qk_norm=True,
        )

    def gguf_metadata(self, c: GemmaConfig) -> dict[str, Any]:
        meta = {"general.architecture": ARCH, **fields_to_gguf(CONFIG_FIELDS, c, ARCH)}
        if any(c.swa_layers):
            meta[f"{ARCH}.attention.sliding_window"] = c.n_swa
            meta |= swa_layers_to_gguf(c, PATTERN)
        return meta | attn_scalar_to_gguf(c) | rope_scale_to_gguf(c)

    def example_fields(self) -> dict[str, Any]:
        # separate RoPE per layer type, the global one linearly scaled (factor 2)
        return {
            "qk_norm": True,
            "rope_freq_base": 1_000_000.0,
            "rope_freq_scale": 0.5,
            "rope_freq_base_swa": 10000.0,
        }


@hookimpl
def tessera_register_architectures(register):
    register(Gemma3Architecture())

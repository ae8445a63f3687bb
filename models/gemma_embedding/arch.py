"""The ``gemma-embedding`` architecture: EmbeddingGemma (bidirectional Gemma 3 layers).

A Gemma 3 text stack whose attention looks both ways (HF ``gemma3_text`` with
``use_bidirectional_attention``): token embeddings scaled by ``sqrt(n_embd)``; per layer
RMSNorm -> attention (GQA, per-head Q/K RMSNorm, NeoX RoPE, scale
``query_pre_attn_scalar ** -0.5``) -> RMSNorm -> residual -> RMSNorm -> GELU(tanh)-gated
FFN -> RMSNorm -> residual; a final RMSNorm. Sliding layers (five of every six) see only
rows less than ``n_swa // 2 + 1`` positions away, in both directions, and use the local
RoPE base. Like llama.cpp, GGUF norm weights hold ``1 + w`` (Gemma's norm offset), so
plain RMSNorm applies them. After mean pooling the core applies the sentence-transformers
Dense projections stored as ``dense_2`` / ``dense_3`` (:func:`tessera.engine.pooling.dense_out`).

Keys and tensor names are llama.cpp's ``gemma-embedding``; the local RoPE base (10000)
and the sliding pattern (every 6th layer global) are fixed there as here. An encoder: no
KV cache, no LM head, embedding mode only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import EncoderArchitecture, check_tensors, metadata_key
from tessera.contract.names import (
    ConfigField,
    TensorNames,
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
    tensors_from_hf,
)
from tessera.engine.pooling import POOLING_TYPES, pooling_name
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.gemma_embedding.graph import ROPE_BASE_LOCAL, GemmaEmbeddingGraph

TESSERA_PLUGIN_API = 2

ARCH = "gemma-embedding"
SWA_PATTERN = 6  # every 6th layer attends globally (llama.cpp's fixed Gemma 3 pattern)


@attrs.frozen
class GemmaEmbeddingConfig:
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int = 2048
    rms_eps: float = 1e-6
    rope_freq_base: float = 1_000_000.0
    #: HF ``sliding_window`` as config.json stores it; rows see ``n_swa // 2 + 1`` apart.
    n_swa: int = 512
    query_pre_attn_scalar: float = 256.0
    pooling_type: str = attrs.field(default="mean", validator=attrs.validators.in_(POOLING_TYPES))
    #: Output sizes of the Dense projections after pooling (``()``: none).
    dense_dims: tuple[int, ...] = ()

    def is_swa(self, il: int) -> bool:
        return (il + 1) % SWA_PATTERN != 0


def _gemma_norm(w: Any, c: Any) -> np.ndarray:
    return np.asarray(w, dtype=np.float32) + 1.0  # Gemma's (1 + w), baked in as llama.cpp does


_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "dense_2_out.weight": "dense_2.weight",
    "dense_3_out.weight": "dense_3.weight",
}
HF_NAMES = TensorNames(
    global_names=_HF_GLOBAL_NAMES,
    layer_names=_HF_LAYER_NAMES,
    checkpoint="an EmbeddingGemma",
    plugin="gemma-embedding",
    layer_prefix="layers.",
    prefixes=("model.",),
    transforms={
        name: _gemma_norm
        for name in (*_HF_LAYER_NAMES.values(), *_HF_GLOBAL_NAMES.values())
        if name.endswith("norm.weight")
    },
)
CONFIG_FIELDS = (
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=2048),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    # None when not stated: default_head_dims derives them
    ConfigField("n_head_kv", "attention.head_count_kv", "num_key_value_heads", default=None),
    ConfigField(
        "head_dim", ("attention.key_length", "attention.value_length"), "head_dim", default=None
    ),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-6),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 1_000_000.0),
    ConfigField("n_swa", "attention.sliding_window", "sliding_window", default=512),
    # GGUF states the vocabulary by the embedding's shape
    ConfigField("n_vocab", (), "vocab_size"),
)


class GemmaEmbeddingArchitecture(EncoderArchitecture):
    names = (ARCH,)
    hf_model_types = ("gemma3_text",)

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> GemmaEmbeddingConfig:
        def key(name: str, default: Any = None) -> Any:
            return metadata_key(metadata, ARCH, name, default)

        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, ARCH))
        dense = tuple(
            int(tensor_shapes[n][0])
            for n in ("dense_2.weight", "dense_3.weight")
            if n in tensor_shapes
        )
        return GemmaEmbeddingConfig(
            **fields,
            n_vocab=int(tensor_shapes["token_embd.weight"][0]),
            # llama.cpp scales by head_dim ** -0.5 when the file says nothing
            query_pre_attn_scalar=float(key("attention.query_pre_attn_scalar", fields["head_dim"])),
            pooling_type=pooling_name(int(key("pooling_type", 1))),
            dense_dims=dense,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> GemmaEmbeddingConfig:
        if not hf.get("use_bidirectional_attention"):
            raise ModelFileError(
                "this gemma3_text model attends causally (a language model); tessera's "
                "gemma-embedding plugin loads only bidirectional ones such as EmbeddingGemma"
            )
        layer_types = hf.get("layer_types") or []
        expected = [
            "sliding_attention" if (i + 1) % SWA_PATTERN else "full_attention"
            for i in range(int(hf["num_hidden_layers"]))
        ]
        if layer_types and list(layer_types) != expected:
            raise ModelFileError(
                "this model's layer_types differ from Gemma 3's every-6th-layer-global pattern, "
                "which GGUF cannot state; it is not supported"
            )
        rope = hf.get("rope_parameters") or {}
        full = rope.get("full_attention", rope) if isinstance(rope, dict) else {}
        local = rope.get("sliding_attention", {}) if isinstance(rope, dict) else {}
        for params in (full, local):
            if params.get("rope_type", "default") != "default":
                raise ModelFileError(
                    f"RoPE scaling '{params['rope_type']}' is not supported by gemma-embedding"
                )
        if float(local.get("rope_theta", ROPE_BASE_LOCAL)) != ROPE_BASE_LOCAL:
            raise ModelFileError("a local RoPE base other than 10000 cannot be stored in GGUF")
        return GemmaEmbeddingConfig(
            **default_head_dims(fields_from_hf(CONFIG_FIELDS, hf)),
            rope_freq_base=float(full.get("rope_theta", hf.get("rope_theta", 1_000_000.0))),
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            pooling_type=str(hf.get("_st_pooling") or "mean"),
            # Dense projections (2_Dense, 3_Dense) arrive as tensors; pooling applies them
        )

    def gguf_metadata(self, c: GemmaEmbeddingConfig) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "general.architecture": ARCH,
            **fields_to_gguf(CONFIG_FIELDS, c, ARCH),
            f"{ARCH}.attention.causal": False,
            f"{ARCH}.pooling_type": POOLING_TYPES.index(c.pooling_type),
        }
        if c.query_pre_attn_scalar != c.head_dim:
            meta[f"{ARCH}.attention.query_pre_attn_scalar"] = c.query_pre_attn_scalar
        return meta

    def tensor_shapes(self, c: GemmaEmbeddingConfig) -> dict[str, tuple[int, ...]]:
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, c.n_embd)}
        for i in range(c.n_layer):
            p = f"blk.{i}."
            for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                shapes[p + norm + ".weight"] = (c.n_embd,)
            shapes[p + "attn_q.weight"] = (q_dim, c.n_embd)
            shapes[p + "attn_k.weight"] = (kv_dim, c.n_embd)
            shapes[p + "attn_v.weight"] = (kv_dim, c.n_embd)
            shapes[p + "attn_q_norm.weight"] = (c.head_dim,)
            shapes[p + "attn_k_norm.weight"] = (c.head_dim,)
            shapes[p + "attn_output.weight"] = (c.n_embd, q_dim)
            shapes[p + "ffn_gate.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_up.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_down.weight"] = (c.n_embd, c.n_ff)
        shapes["output_norm.weight"] = (c.n_embd,)
        width = c.n_embd
        for n, out in zip(("dense_2.weight", "dense_3.weight"), c.dense_dims, strict=False):
            shapes[n] = (out, width)
            width = out
        return shapes

    def tensors_from_hf(
        self, c: GemmaEmbeddingConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        return tensors_from_hf(HF_NAMES, c, hf_tensors, for_gguf)

    def example_config(self, **overrides: Any) -> GemmaEmbeddingConfig:
        overrides.pop("arch", None)
        fields = {
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_ff": 128,
            "n_head": 4,
            "n_head_kv": 2,
            "n_ctx_train": 128,
        } | overrides
        fields.setdefault("head_dim", fields["n_embd"] // fields["n_head"])
        fields.setdefault("query_pre_attn_scalar", float(fields["head_dim"]))
        return GemmaEmbeddingConfig(**fields)

    def required_ops(self, c: GemmaEmbeddingConfig) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("scale", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", {"n_rot": c.head_dim, "head_dim": c.head_dim, "neox": True}),
            ("attention", {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}),
            ("gelu", {}),
        ]

    def build(self, c: GemmaEmbeddingConfig, weights: Mapping[str, Any], backend: Any) -> Any:
        check_tensors(ARCH, self.tensor_shapes(c), weights)
        return GemmaEmbeddingGraph(c, weights, backend)


@hookimpl
def tessera_register_architectures(register):
    register(GemmaEmbeddingArchitecture())

"""The llama family's config and how it is stored: the GGUF keys and ``config.json``
fields of each config field and the Hugging Face tensor names (see
:mod:`tessera.models.llama.arch`, which reads and writes them)."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from tessera.contract.names import REQUIRED, ConfigField, TensorNames

ARCHS = ("llama", "qwen2", "qwen3")


@attrs.frozen
class LlamaConfig:
    """Hyper-parameters of one llama-family model, in GGUF terms."""

    arch: str = attrs.field(validator=attrs.validators.in_(ARCHS))
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int = 4096
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rms_eps: float = 1e-5
    #: True: NeoX pairs (i, i + n_rot/2) on unpermuted Q/K; False: GGML normal mode.
    rope_neox: bool = True
    attn_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    #: MTP ("nextn") blocks stored after the main ones (GGUF ``{arch}.nextn_predict_layers``;
    #: ``block_count`` counts them too). The main forward pass never runs them.
    n_nextn: int = 0

    def __attrs_post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )


def _permute_for_normal_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder each head's rows from NeoX halves to interleaved pairs (llama.cpp's layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _permute_q(w: Any, c: LlamaConfig) -> Any:
    # llama.cpp's llama arch runs GGML normal-mode RoPE on permuted rows; qwen2/3 run NeoX
    return _permute_for_normal_rope(np.asarray(w), c.n_head) if c.arch == "llama" else w


def _permute_k(w: Any, c: LlamaConfig) -> Any:
    return _permute_for_normal_rope(np.asarray(w), c.n_head_kv) if c.arch == "llama" else w


HF_NAMES = TensorNames(
    global_names={
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.o_proj.bias": "attn_output.bias",
        "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    },
    checkpoint="a llama",
    plugin="llama architecture",
    skip_suffixes=("rotary_emb.inv_freq",),
    gguf_transforms={
        "attn_q.weight": _permute_q,
        "attn_q.bias": _permute_q,
        "attn_k.weight": _permute_k,
        "attn_k.bias": _permute_k,
    },
)
CONFIG_FIELDS = (
    ConfigField("n_vocab", "vocab_size", "vocab_size", default=None, hf_default=REQUIRED),
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=4096),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),  # GGUF: + n_nextn
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    # None when not stated: default_head_dims derives them
    ConfigField("n_head_kv", "attention.head_count_kv", "num_key_value_heads", default=None),
    ConfigField(
        "head_dim",
        ("attention.key_length", "attention.value_length", "rope.dimension_count"),
        "head_dim",
        default=None,
    ),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-5, 1e-6),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 10000.0),
    ConfigField("n_nextn", "nextn_predict_layers", (), default=0, omit_default=True),
    # GGUF states it by the absence of output.weight
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, False),
)

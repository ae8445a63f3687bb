"""The Gemma 2 / Gemma 3 config and how it is stored: the GGUF keys and ``config.json`` fields
both families share, the Hugging Face tensor names, and the facts llama.cpp derives instead
of storing them (the sliding-window pattern, the attention scale, RoPE per layer type).

Each family's own keys and defaults are read in :mod:`tessera.models.gemma.gemma2` and
:mod:`tessera.models.gemma.gemma3`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import metadata_key
from tessera.contract.names import ConfigField, TensorNames
from tessera.errors import ModelFileError

ARCHS = ("gemma2", "gemma3")
#: Layer counts of the 27B models, whose attention scale llama.cpp takes from n_embd / n_head
#: (transformers' query_pre_attn_scalar), not from the head width.
LAYERS_27B = {"gemma2": 46, "gemma3": 62}
#: tessera's own key for a query_pre_attn_scalar that llama.cpp's rule would not give.
ATTN_SCALAR_KEY = "attention.query_pre_attn_scalar"


def _bools(value: Any) -> tuple[bool, ...]:
    return tuple(bool(v) for v in value)


@attrs.frozen
class GemmaConfig:
    """Hyper-parameters of one Gemma 2 or Gemma 3 text model, in GGUF terms."""

    arch: str = attrs.field(validator=attrs.validators.in_(ARCHS))
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    #: True where the layer attends within the sliding window.
    swa_layers: tuple[bool, ...] = attrs.field(converter=_bools)
    #: A sliding layer's query at position p sees keys at positions > p - n_swa.
    n_swa: int
    #: transformers' ``query_pre_attn_scalar``: scores are scaled by its ``-0.5`` power.
    query_pre_attn_scalar: float
    n_ctx_train: int = 8192
    rms_eps: float = 1e-6
    #: RoPE of global layers, then of sliding ones (base, and 1 / linear scaling factor).
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    #: Gemma 2 caps attention scores and final logits as ``c * tanh(x / c)`` (0: no cap).
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    #: Gemma 3 RMS-normalizes each head of Q and K.
    qk_norm: bool = False
    tied_embeddings: bool = True

    def __attrs_post_init__(self) -> None:
        if len(self.swa_layers) != self.n_layer:
            raise ModelFileError(
                f"the sliding-window pattern lists {len(self.swa_layers)} layers but the model "
                f"has {self.n_layer}; the file is inconsistent — convert it again"
            )
        if self.n_head % self.n_head_kv:
            raise ModelFileError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )

    def window(self, il: int) -> int:
        """Layer ``il``'s attention window (0: it sees every earlier position)."""
        return self.n_swa if self.swa_layers[il] else 0

    def rope(self, il: int) -> tuple[float, float]:
        """``(freq_base, freq_scale)`` of layer ``il``'s RoPE."""
        if self.swa_layers[il]:
            return self.rope_freq_base_swa, self.rope_freq_scale_swa
        return self.rope_freq_base, self.rope_freq_scale


def swa_pattern(n_layer: int, n_pattern: int) -> tuple[bool, ...]:
    """llama.cpp's pattern of period ``n_pattern``: the last layer of each period is global
    (0: every layer slides)."""
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def swa_layers_from_gguf(
    metadata: Mapping[str, Any], arch: str, n_layer: int, default_pattern: int
) -> tuple[bool, ...]:
    """``{arch}.attention.sliding_window_pattern``: one flag per layer, or a period, else
    the family's default period."""
    value = metadata.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(value, list | tuple | np.ndarray):
        return _bools(value)
    return swa_pattern(n_layer, default_pattern if value is None else int(value))


def swa_layers_from_hf(hf: Mapping[str, Any], default_pattern: int) -> tuple[bool, ...]:
    """``layer_types`` of a ``config.json``, else its ``sliding_window_pattern`` period (what
    transformers derives when layer_types is absent)."""
    types = hf.get("layer_types")
    if types:
        return tuple(t == "sliding_attention" for t in types)
    n_pattern = int(hf.get("sliding_window_pattern") or default_pattern)
    return swa_pattern(int(hf["num_hidden_layers"]), n_pattern)


def swa_layers_to_gguf(c: GemmaConfig, default_pattern: int) -> dict[str, Any]:
    """The pattern key, written only where llama.cpp's default period would be wrong."""
    if c.swa_layers == swa_pattern(c.n_layer, default_pattern):
        return {}
    return {f"{c.arch}.attention.sliding_window_pattern": list(c.swa_layers)}


def llama_cpp_attn_scalar(arch: str, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> int:
    """The query_pre_attn_scalar llama.cpp assumes: n_embd / n_head for the 27B models, the
    head width otherwise (it is not stored in GGUF)."""
    return n_embd // n_head if n_layer == LAYERS_27B[arch] else head_dim


def attn_scalar_from_gguf(
    metadata: Mapping[str, Any], arch: str, fields: Mapping[str, Any]
) -> float:
    rule = llama_cpp_attn_scalar(
        arch, fields["n_layer"], fields["n_embd"], fields["n_head"], fields["head_dim"]
    )
    return float(metadata.get(f"{arch}.{ATTN_SCALAR_KEY}", rule))


def attn_scalar_to_gguf(c: GemmaConfig) -> dict[str, Any]:
    rule = llama_cpp_attn_scalar(c.arch, c.n_layer, c.n_embd, c.n_head, c.head_dim)
    if c.query_pre_attn_scalar == rule:
        return {}
    return {f"{c.arch}.{ATTN_SCALAR_KEY}": float(c.query_pre_attn_scalar)}


def rope_scale_from_gguf(metadata: Mapping[str, Any], arch: str) -> float:
    """``1 / rope.scaling.factor`` for linear scaling, 1 without; other types are refused."""
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return 1.0
    if kind != "linear":
        raise ModelFileError(
            f"RoPE scaling type '{kind}' is not supported by the {arch} plugin; use a model "
            "with linear or no RoPE scaling"
        )
    return 1.0 / float(metadata_key(metadata, arch, "rope.scaling.factor"))


def rope_scale_to_gguf(c: GemmaConfig) -> dict[str, Any]:
    if c.rope_freq_scale == 1.0:
        return {}
    return {
        f"{c.arch}.rope.scaling.type": "linear",
        f"{c.arch}.rope.scaling.factor": 1.0 / c.rope_freq_scale,
    }


def rope_from_hf(params: Mapping[str, Any], theta: float, arch: str) -> tuple[float, float]:
    """``(freq_base, freq_scale)`` of one ``rope_parameters`` entry (default or linear)."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear"):
        raise ModelFileError(
            f"RoPE scaling type '{kind}' is not supported by the {arch} plugin; use a model "
            "with linear or no RoPE scaling"
        )
    scale = 1.0 / float(params.get("factor", 1.0)) if kind == "linear" else 1.0
    return float(params.get("rope_theta", theta)), scale


#: Fields stored alike by both families (GGUF ``{arch}.*`` keys and config.json names).
COMMON_FIELDS = (
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=8192),
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
    # GGUF states these by the tensors (token_embd's rows, the absence of output.weight)
    ConfigField("n_vocab", (), "vocab_size"),
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, True),
)


def _gemma_norm(w: Any, c: Any) -> np.ndarray:
    # Gemma's RMSNorm multiplies by (1 + w); GGUF stores 1 + w, as llama.cpp's converter does
    return np.asarray(w, dtype=np.float32) + 1.0


_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
HF_NAMES = TensorNames(
    global_names=_GLOBAL_NAMES,
    layer_names=_LAYER_NAMES,
    checkpoint="a Gemma",
    plugin="gemma",
    skip_suffixes=("rotary_emb.inv_freq",),
    transforms={
        name: _gemma_norm
        for name in (*_LAYER_NAMES.values(), *_GLOBAL_NAMES.values())
        if name.endswith("norm.weight")
    },
)

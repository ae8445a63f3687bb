"""The gpt-oss config and how it is stored: the GGUF keys llama.cpp's ``gpt-oss`` reads, the
``config.json`` fields transformers' ``GptOssConfig`` has, and the facts llama.cpp derives
instead of storing (the sliding-window pattern, the SwiGLU's constants).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.names import ConfigField
from tessera.errors import ModelFileError

ARCH = "gpt-oss"
#: llama.cpp's period of the sliding-window pattern when GGUF states none: layer 0 slides,
#: layer 1 attends to everything, and so on (transformers' ``layer_types`` default too).
SWA_PERIOD = 2
#: The clamped SwiGLU's constants, fixed in llama.cpp's graph (transformers'
#: ``swiglu_alpha`` / ``swiglu_limit`` defaults).
SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def _bools(value: Any) -> tuple[bool, ...]:
    return tuple(bool(v) for v in value)


@attrs.frozen
class Yarn:
    """YaRN's stretch of RoPE (GGUF ``rope.scaling.*``; transformers' ``rope_parameters``)."""

    factor: float
    #: ``rope.scaling.original_context_length``: the context the model was trained on.
    n_ctx_orig: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    #: Round the correction range outwards to whole dims, as ggml always does. gpt-oss's
    #: ``config.json`` says ``truncate: false`` (transformers then keeps the exact range);
    #: GGUF has no key for it, so llama.cpp's files run truncated.
    truncate: bool = True


@attrs.frozen
class GptOssConfig:
    """Hyper-parameters of one gpt-oss model, in GGUF terms."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    #: Rows of each expert's gate and up projections (``expert_feed_forward_length``).
    n_ff_exp: int
    #: A sliding layer's query at position p sees keys at positions above p - n_swa.
    n_swa: int
    #: True where the layer attends within the sliding window.
    swa_layers: tuple[bool, ...] = attrs.field(converter=_bools)
    n_ctx_train: int = 131072
    rms_eps: float = 1e-5
    rope_freq_base: float = 150000.0
    #: Sliding layers' RoPE base (``rope.freq_base_swa``; the global one when absent).
    rope_freq_base_swa: float = attrs.field(
        default=attrs.Factory(lambda self: self.rope_freq_base, takes_self=True)
    )
    yarn: Yarn | None = None
    swiglu_alpha: float = SWIGLU_ALPHA
    swiglu_limit: float = SWIGLU_LIMIT
    arch: str = ARCH

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
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(
                f"expert_used_count ({self.n_expert_used}) must be between 1 and expert_count "
                f"({self.n_expert}); the model file is inconsistent — convert it again"
            )

    def window(self, il: int) -> int:
        """Layer ``il``'s attention window (0: it sees every earlier position)."""
        return self.n_swa if self.swa_layers[il] else 0


def swa_pattern(n_layer: int, period: int = SWA_PERIOD) -> tuple[bool, ...]:
    """llama.cpp's pattern of ``period``: the last layer of each period attends to everything
    (0: every layer slides)."""
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))


def swa_layers_from_gguf(metadata: Mapping[str, Any], n_layer: int) -> tuple[bool, ...]:
    """``gpt-oss.attention.sliding_window_pattern``: one flag per layer, or a period, else
    llama.cpp's period of 2."""
    value = metadata.get(f"{ARCH}.attention.sliding_window_pattern")
    if isinstance(value, list | tuple | np.ndarray):
        return _bools(value)
    return swa_pattern(n_layer, SWA_PERIOD if value is None else int(value))


def swa_layers_from_hf(hf: Mapping[str, Any]) -> tuple[bool, ...]:
    """``layer_types`` of a ``config.json``, else transformers' default (period 2)."""
    types = hf.get("layer_types")
    if types:
        return tuple(t == "sliding_attention" for t in types)
    return swa_pattern(int(hf["num_hidden_layers"]))


def swa_layers_to_gguf(c: GptOssConfig) -> dict[str, Any]:
    """The pattern key, written only where llama.cpp's default period would be wrong."""
    if c.swa_layers == swa_pattern(c.n_layer):
        return {}
    return {f"{ARCH}.attention.sliding_window_pattern": list(c.swa_layers)}


def yarn_from_gguf(metadata: Mapping[str, Any], n_ctx_train: int) -> Yarn | None:
    """llama.cpp's ``rope.scaling.*`` keys: YaRN or none; tessera's ``yarn_truncate`` key
    (which llama.cpp ignores) keeps an HF checkpoint's untruncated range."""

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{ARCH}.rope.scaling.{name}", default)

    kind = key("type", "none")
    if kind == "none":
        return None
    if kind != "yarn":
        raise ModelFileError(
            f"RoPE scaling type '{kind}' is not one the gpt-oss plugin runs (yarn or none); "
            "this model cannot be loaded"
        )
    return Yarn(
        factor=float(key("factor", 1.0)),
        n_ctx_orig=int(key("original_context_length", 0) or n_ctx_train),
        beta_fast=float(key("yarn_beta_fast", 32.0)),
        beta_slow=float(key("yarn_beta_slow", 1.0)),
        truncate=bool(key("yarn_truncate", True)),
    )


def yarn_from_hf(hf: Mapping[str, Any]) -> Yarn | None:
    """transformers' ``rope_parameters`` (or the older ``rope_scaling``): YaRN or default."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    # what GGUF cannot state, or llama.cpp overrides for YaRN: refused, not run otherwise
    unstated = [
        k
        for k in ("attention_factor", "mscale", "mscale_all_dim", "extrapolation_factor")
        if rope.get(k) is not None
    ]
    if kind != "yarn" or unstated:
        raise ModelFileError(
            f"this checkpoint's RoPE ({kind}{', ' + ', '.join(unstated) if unstated else ''}) "
            "is not the plain YaRN llama.cpp's gpt-oss runs; it is not supported"
        )
    return Yarn(
        factor=float(rope["factor"]),
        n_ctx_orig=int(rope["original_max_position_embeddings"]),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        truncate=bool(rope.get("truncate", True)),
    )


def yarn_to_gguf(yarn: Yarn | None) -> dict[str, Any]:
    if yarn is None:
        return {}
    p = f"{ARCH}.rope.scaling."
    meta = {
        p + "type": "yarn",
        p + "factor": yarn.factor,
        p + "original_context_length": yarn.n_ctx_orig,
        p + "yarn_beta_fast": yarn.beta_fast,
        p + "yarn_beta_slow": yarn.beta_slow,
    }
    if not yarn.truncate:
        meta[p + "yarn_truncate"] = False
    return meta


#: Fields stored as they are (GGUF ``gpt-oss.*`` keys, config.json names).
CONFIG_FIELDS = (
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=131072),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    ConfigField("n_head_kv", "attention.head_count_kv", "num_key_value_heads", default=None),
    ConfigField(
        "head_dim", ("attention.key_length", "attention.value_length"), "head_dim", default=None
    ),
    ConfigField("n_expert", "expert_count", "num_local_experts"),
    ConfigField("n_expert_used", "expert_used_count", "num_experts_per_tok"),
    # llama.cpp writes the experts' width under both keys and reads the expert one
    ConfigField(
        "n_ff_exp", ("expert_feed_forward_length", "feed_forward_length"), "intermediate_size"
    ),
    ConfigField("n_swa", "attention.sliding_window", "sliding_window"),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-5),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 10000.0),
    # tessera's keys (llama.cpp fixes the constants): written only for other values
    ConfigField(
        "swiglu_alpha", "swiglu_alpha", "swiglu_alpha", float, SWIGLU_ALPHA, omit_default=True
    ),
    ConfigField(
        "swiglu_limit", "swiglu_limit", "swiglu_limit", float, SWIGLU_LIMIT, omit_default=True
    ),
    # GGUF states it by token_embd's rows
    ConfigField("n_vocab", (), "vocab_size"),
)

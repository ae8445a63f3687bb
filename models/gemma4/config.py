"""The Gemma 4 config: reading it from GGUF metadata or a transformers ``config.json`` and
writing it back as llama.cpp's ``gemma4`` GGUF keys (see :mod:`tessera.models.gemma4.arch`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.names import (
    REQUIRED,
    ConfigField,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
)
from tessera.errors import ModelFileError

ARCH = "gemma4"
#: Divisor of RoPE pairs that do not rotate (llama.cpp's ``rope_freqs`` for proportional RoPE).
NO_ROTATION = 1e30


def _tuple(value: Any) -> tuple:
    return tuple(value)


@attrs.frozen
class Gemma4Config:
    """Hyper-parameters in GGUF terms; per-layer facts are tuples of length ``n_layer``."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: tuple[int, ...] = attrs.field(converter=_tuple)
    n_ff: tuple[int, ...] = attrs.field(converter=_tuple)
    #: True where the layer uses sliding-window attention (``sliding_window_pattern``).
    swa_layers: tuple[bool, ...] = attrs.field(converter=_tuple)
    head_dim: int  # global (full-attention) layers
    head_dim_swa: int
    n_swa: int
    n_kv_shared: int = 0
    #: Width of each layer's slice of the per-layer embedding (0: no PLE).
    n_embd_per_layer: int = 0
    rope_freq_base: float = 1_000_000.0
    rope_freq_base_swa: float = 10_000.0
    #: Rotated fraction of global layers' heads (proportional RoPE); 1.0 rotates all.
    #: None when read from GGUF, which stores the factors instead (``rope_freqs.weight``).
    partial_rotary_factor: float | None = 1.0
    rms_eps: float = 1e-6
    final_logit_softcapping: float = 0.0
    n_ctx_train: int = 131072
    tied_embeddings: bool = True
    #: Global layers without V projection reuse the raw K projection as V.
    k_eq_v: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("n_head_kv", "n_ff", "swa_layers"):
            if len(getattr(self, name)) != self.n_layer:
                raise ModelFileError(
                    f"{name} lists {len(getattr(self, name))} layers but the model has "
                    f"{self.n_layer}; the file is inconsistent — convert it again"
                )
        if not 0 <= self.n_kv_shared < self.n_layer:
            raise ModelFileError(
                f"{self.n_kv_shared} KV-shared layers do not fit in {self.n_layer} layers"
            )
        self.kv_sources()  # every shared layer must find a producer

    @property
    def first_shared(self) -> int:
        """Index of the first layer that writes no KV (``n_layer`` when none shares)."""
        return self.n_layer - self.n_kv_shared

    def layer_head_dim(self, il: int) -> int:
        return self.head_dim_swa if self.swa_layers[il] else self.head_dim

    def kv_sources(self) -> list[int]:
        """Per layer, the layer whose cache it attends to: itself, or for a KV-shared layer
        the last earlier non-shared layer of the same attention type."""
        sources = list(range(self.first_shared))
        for il in range(self.first_shared, self.n_layer):
            same = [
                j for j in range(self.first_shared) if self.swa_layers[j] == self.swa_layers[il]
            ]
            if not same:
                kind = "sliding" if self.swa_layers[il] else "global"
                raise ModelFileError(
                    f"KV-shared layer {il} is a {kind}-attention layer but no earlier layer of "
                    "that type writes KV; the model file is inconsistent"
                )
            sources.append(same[-1])
        return sources

    def rope_factors(self) -> np.ndarray:
        """``rope_freqs`` of global layers: 1 for rotated pairs, :data:`NO_ROTATION` after."""
        if self.partial_rotary_factor is None:
            raise ValueError("this config was read from GGUF: its RoPE factors are a tensor")
        n_pairs = self.head_dim // 2
        n_rotated = int(self.partial_rotary_factor * self.head_dim // 2)
        return np.where(np.arange(n_pairs) < n_rotated, 1.0, NO_ROTATION).astype(np.float32)


def per_layer(value: Any, n_layer: int) -> tuple[int, ...]:
    """A GGUF key that is a scalar or one value per layer, as a per-layer tuple."""
    if isinstance(value, list | tuple | np.ndarray):
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def _bools(value: Any) -> tuple[bool, ...]:
    return tuple(bool(v) for v in value)


#: The fields GGUF and config.json store as they are; per-layer lists are read as stored
#: (type None) and made per-layer tuples in config_from_gguf.
CONFIG_FIELDS = (
    ConfigField("n_vocab", "vocab_size", "vocab_size", default=None, hf_default=REQUIRED),
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=131072),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),
    ConfigField("n_ff", "feed_forward_length", (), None),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    ConfigField("n_head_kv", "attention.head_count_kv", (), None),
    ConfigField(
        "head_dim",
        ("attention.key_length", "attention.value_length", "rope.dimension_count"),
    ),
    ConfigField(
        "head_dim_swa",
        ("attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa"),
        "head_dim",
        hf_default=256,
    ),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-6),
    ConfigField("n_swa", "attention.sliding_window", "sliding_window", hf_default=512),
    ConfigField("swa_layers", "attention.sliding_window_pattern", (), _bools),
    ConfigField("n_kv_shared", "attention.shared_kv_layers", "num_kv_shared_layers", default=0),
    ConfigField(
        "n_embd_per_layer",
        "embedding_length_per_layer_input",
        "hidden_size_per_layer_input",
        default=0,
    ),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 1_000_000.0),
    ConfigField("rope_freq_base_swa", "rope.freq_base_swa", (), float, 10_000.0),
    ConfigField(
        "final_logit_softcapping",
        "final_logit_softcapping",
        "final_logit_softcapping",
        float,
        0.0,
        omit_default=True,
    ),
    # GGUF states these by which tensors the file has (see config_from_gguf)
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, True),
    ConfigField("k_eq_v", (), "attention_k_eq_v", bool, False),
)


def config_from_gguf(
    metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
) -> Gemma4Config:
    """The config of a ``gemma4`` GGUF file (llama.cpp's keys; some facts from tensors)."""
    if any(".ffn_gate_inp." in name for name in tensor_shapes):
        raise ModelFileError(
            "this Gemma 4 model has MoE layers, which the gemma4 plugin does not run yet; "
            "use a dense Gemma 4 model (E2B, E4B, 31B)"
        )
    fields = fields_from_gguf(CONFIG_FIELDS, metadata, ARCH)
    n_layer = fields["n_layer"]
    return Gemma4Config(
        **fields
        | {
            "n_vocab": int(fields["n_vocab"] or tensor_shapes["token_embd.weight"][0]),
            "n_head_kv": per_layer(fields["n_head_kv"], n_layer),
            "n_ff": per_layer(fields["n_ff"], n_layer),
        },
        partial_rotary_factor=None,  # the graph reads rope_freqs.weight
        tied_embeddings="output.weight" not in tensor_shapes,
        k_eq_v=any(
            f"blk.{i}.attn_k.weight" in tensor_shapes
            and f"blk.{i}.attn_v.weight" not in tensor_shapes
            for i in range(n_layer)
        ),
    )


def config_from_hf(hf: Mapping[str, Any]) -> Gemma4Config:
    """The config of a transformers ``gemma4`` (its ``text_config``) or ``gemma4_text``."""
    if hf.get("model_type") == "gemma4":
        hf = hf.get("text_config") or {}
    if hf.get("enable_moe_block"):
        raise ModelFileError(
            "this Gemma 4 model has MoE layers, which the gemma4 plugin does not run yet; "
            "use a dense Gemma 4 model (E2B, E4B, 31B)"
        )
    fields = fields_from_hf(CONFIG_FIELDS, hf)
    n_layer = fields["n_layer"]
    types = list(hf.get("layer_types") or [])
    if not types:
        types = [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layer)
        ]
    types[-1] = "full_attention"  # transformers forces the last layer global
    swa = tuple(t == "sliding_attention" for t in types)
    per_layer = {int(k): v for k, v in (hf.get("per_layer_config") or {}).items()}
    head_dim = int(hf.get("global_head_dim") or 512)
    for i, t in enumerate(swa):
        if not t and "head_dim" in per_layer.get(i, {}):
            head_dim = int(per_layer[i]["head_dim"])
    kv_global = hf.get("num_global_key_value_heads") if fields["k_eq_v"] else None
    n_head_kv = tuple(
        int(
            per_layer.get(i, {}).get("num_key_value_heads")
            or (kv_global if not swa[i] and kv_global else hf["num_key_value_heads"])
        )
        for i in range(n_layer)
    )
    n_kv_shared = fields["n_kv_shared"]
    wide = bool(hf.get("use_double_wide_mlp")) and n_kv_shared > 0
    n_ff = tuple(
        int(hf["intermediate_size"]) * (2 if wide and i >= n_layer - n_kv_shared else 1)
        for i in range(n_layer)
    )
    rope = hf.get("rope_parameters") or {}
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    return Gemma4Config(
        **fields,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        swa_layers=swa,
        head_dim=head_dim,
        rope_freq_base=float(full.get("rope_theta", 1_000_000.0)),
        rope_freq_base_swa=float(local.get("rope_theta", 10_000.0)),
        partial_rotary_factor=float(full.get("partial_rotary_factor", 1.0)),
    )


def gguf_metadata(c: Gemma4Config) -> dict[str, Any]:
    """``c`` as llama.cpp's ``gemma4`` keys (per-layer facts as arrays)."""
    return {"general.architecture": ARCH, **fields_to_gguf(CONFIG_FIELDS, c, ARCH)}

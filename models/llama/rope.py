"""RoPE scaling in the llama family: as GGUF states it (``rope.scaling.*`` keys and the
``rope_freqs`` / ``rope_factors_short`` / ``rope_factors_long`` tensors), as transformers'
``rope_parameters`` state it, and what one layer rotates Q and K with.

- linear: positions are multiplied by ``rope_freq_scale`` (1 / factor);
- llama3: a divisor per rotated pair, stored in GGUF as ``rope_freqs.weight``;
- YaRN: each pair blends interpolation (``rope_freq_scale``) and extrapolation along a ramp
  between the correction dims of ``beta_fast`` and ``beta_slow``, and cos/sin are scaled by
  ``0.1 ln(factor) + 1`` (or llama.cpp's ``yarn_log_multiplier`` ratio). The blend is a
  per-pair factor, so tessera folds it into the divisors ``rope_ext`` takes;
- LongRoPE (Phi-3): per-pair divisors, ``rope_factors_short`` or, when the context is
  longer than the original one, ``rope_factors_long`` (llama.cpp chooses by context size),
  with ``rope.scaling.attn_factor`` on cos/sin.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.rope import RopeArgs
from tessera.contract.yarn import yarn_divisors, yarn_mscale
from tessera.errors import ModelFileError

FREQS, SHORT, LONG = "rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"
KINDS = ("none", "linear", "yarn", "longrope")


@attrs.frozen
class RopeScaling:
    """How a model stretches RoPE past its training context (besides ``rope_freq_scale``)."""

    #: GGUF ``rope.scaling.type``: none, linear, yarn or longrope.
    kind: str = attrs.field(default="none", validator=attrs.validators.in_(KINDS))
    #: ``rope.scaling.original_context_length``: YaRN's correction dims, LongRoPE's choice
    #: of factors and the attention temperature's step (0: the training context).
    n_ctx_orig: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    #: ``rope.scaling.yarn_log_multiplier`` (HF ``mscale_all_dim``); 0 = none.
    yarn_log_mul: float = 0.0
    #: ``rope.scaling.attn_factor``: multiplies cos/sin (LongRoPE's attention factor).
    attn_factor: float = 1.0
    #: Which factor tensors the model has: "" none, "rope_freqs" (llama3), "longrope".
    factors: str = ""
    #: The factors by GGUF tensor name when read from a ``config.json`` (an HF checkpoint
    #: has no such tensors); empty when read from GGUF, whose tensors hold them.
    hf_factors: tuple[tuple[str, tuple[float, ...]], ...] = ()


def needs_rope_ext(rs: RopeScaling) -> bool:
    """Whether a model of this scaling rotates with factors or a magnitude scale."""
    return rs.kind == "yarn" or bool(rs.factors) or rs.attn_factor != 1.0


def rope_args(
    c: Any, il: int, factors: Mapping[str, np.ndarray], n_ctx_seq: int
) -> RopeArgs | None:
    """How layer ``il`` of config ``c`` rotates in a context of ``n_ctx_seq`` cells per
    sequence; None for a layer without RoPE. ``factors`` are the model's factor tensors
    as host arrays."""
    if il in c.nope_layers:
        return None
    rs: RopeScaling = c.rope_scaling
    n_ctx_orig = rs.n_ctx_orig or c.n_ctx_train
    divisors = factors.get(FREQS)
    if rs.factors == "longrope":
        divisors = factors[LONG if n_ctx_seq > n_ctx_orig else SHORT]
    freq_scale, mscale = c.rope_freq_scale, rs.attn_factor
    if rs.kind == "yarn":
        blend = yarn_divisors(
            c.n_rot, c.rope_freq_base, freq_scale, n_ctx_orig, rs.yarn_beta_fast, rs.yarn_beta_slow
        )
        divisors = blend if divisors is None else np.asarray(divisors, np.float64) * blend
        factor = 1.0 / freq_scale
        magnitude = yarn_mscale(factor)
        if rs.yarn_log_mul:  # llama.cpp's ratio (HF: mscale 1 over mscale_all_dim)
            magnitude /= yarn_mscale(factor, rs.yarn_log_mul)
        freq_scale, mscale = 1.0, mscale * magnitude
    return RopeArgs(c.n_rot, c.rope_freq_base, freq_scale, c.rope_neox, divisors, mscale)


def rope_scaling_from_gguf(
    metadata: Mapping[str, Any], arch: str, tensor_shapes: Mapping[str, tuple[int, ...]]
) -> tuple[float, RopeScaling]:
    """``(rope_freq_scale, RopeScaling)`` from llama.cpp's keys; the factor tensors are
    known by their presence."""

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.rope.scaling.{name}", default)

    kind = str(key("type", "none"))
    if kind not in KINDS:
        raise ModelFileError(
            f"RoPE scaling type '{kind}' is not one tessera runs (none, linear, yarn, longrope); "
            "this model cannot be loaded"
        )
    factor = float(key("factor") or metadata.get(f"{arch}.rope.scale_linear") or 0.0)
    freq_scale = 1.0 / factor if factor and kind != "none" else 1.0
    factors = (
        "rope_freqs" if FREQS in tensor_shapes else "longrope" if LONG in tensor_shapes else ""
    )
    return freq_scale, RopeScaling(
        kind=kind,
        n_ctx_orig=int(key("original_context_length", 0)),
        yarn_beta_fast=float(key("yarn_beta_fast", 32.0)),
        yarn_beta_slow=float(key("yarn_beta_slow", 1.0)),
        yarn_log_mul=float(key("yarn_log_multiplier", 0.0)),
        attn_factor=float(key("attn_factor", 1.0)),
        factors=factors,
    )


def _llama3_divisors(rope: Mapping[str, Any], n_rot: int, freq_base: float) -> list[float]:
    """llama3's per-pair divisors: 1 for short wavelengths, ``factor`` for long ones, a
    smooth blend between (what llama.cpp's converter writes as ``rope_freqs``)."""
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings", 8192))
    divisors = []
    for i in range(n_rot // 2):
        wavelen = 2 * math.pi * freq_base ** (2 * i / n_rot)
        if wavelen < old / high:
            divisors.append(1.0)
        elif wavelen > old / low:
            divisors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return divisors


def rope_scaling_from_hf(
    hf: Mapping[str, Any], n_rot: int, freq_base: float
) -> tuple[float, RopeScaling]:
    """``(rope_freq_scale, RopeScaling)`` from transformers' ``rope_parameters`` (or the
    older ``rope_scaling``)."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    kind = rope.get("rope_type", rope.get("type", "default"))
    factor = float(rope.get("factor") or 1.0)
    orig = int(
        rope.get("original_max_position_embeddings")
        or hf.get("original_max_position_embeddings")
        or 0
    )
    if kind == "default":
        return 1.0, RopeScaling(n_ctx_orig=orig)
    if kind == "linear":
        return 1.0 / factor, RopeScaling(kind="linear", n_ctx_orig=orig)
    if kind == "llama3":
        divisors = tuple(_llama3_divisors(rope, n_rot, freq_base))
        return 1.0, RopeScaling(
            n_ctx_orig=orig, factors="rope_freqs", hf_factors=((FREQS, divisors),)
        )
    if kind == "yarn":
        mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
        if rope.get("attention_factor") is not None or (mscale and all_dim and mscale != 1.0):
            raise ModelFileError(
                "this checkpoint's YaRN sets attention_factor or an mscale other than 1, "
                "which GGUF (and so tessera) cannot state; use a model without them"
            )
        return 1.0 / factor, RopeScaling(
            kind="yarn",
            n_ctx_orig=orig,
            yarn_beta_fast=float(rope.get("beta_fast") or 32.0),
            yarn_beta_slow=float(rope.get("beta_slow") or 1.0),
            yarn_log_mul=float(all_dim) if mscale and all_dim else 0.0,
        )
    if kind in ("longrope", "su"):
        scale = float(rope.get("factor") or hf["max_position_embeddings"] / orig)
        attn = rope.get("attention_factor")
        if attn is None:
            attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        short, long = (tuple(float(v) for v in rope[k]) for k in ("short_factor", "long_factor"))
        return 1.0, RopeScaling(
            kind="longrope",
            n_ctx_orig=orig,
            attn_factor=float(attn),
            factors="longrope",
            hf_factors=((SHORT, short), (LONG, long)),
        )
    raise ModelFileError(
        f"RoPE scaling type '{kind}' is not supported by the llama architecture plugin "
        "(default, linear, llama3, yarn and longrope are); use a model with one of those"
    )


def rope_scaling_to_gguf(freq_scale: float, rs: RopeScaling, arch: str) -> dict[str, Any]:
    """llama.cpp's ``rope.scaling.*`` keys for a config (the factors are tensors)."""
    p = f"{arch}.rope.scaling."
    meta: dict[str, Any] = {}
    kind = "linear" if rs.kind == "none" and freq_scale != 1.0 else rs.kind
    if kind != "none":
        meta[p + "type"] = kind
    if freq_scale != 1.0:
        meta[p + "factor"] = 1.0 / freq_scale
    if rs.n_ctx_orig:
        meta[p + "original_context_length"] = rs.n_ctx_orig
    if kind == "yarn":
        meta[p + "yarn_beta_fast"] = rs.yarn_beta_fast
        meta[p + "yarn_beta_slow"] = rs.yarn_beta_slow
        if rs.yarn_log_mul:
            meta[p + "yarn_log_multiplier"] = rs.yarn_log_mul
    if rs.attn_factor != 1.0:
        meta[p + "attn_factor"] = rs.attn_factor
    return meta


def factor_tensors(rs: RopeScaling) -> Iterator[tuple[str, np.ndarray]]:
    """The factor tensors of a config read from HF (computed; HF stores none)."""
    for name, values in rs.hf_factors:
        yield name, np.asarray(values, dtype=np.float32)


def factor_shapes(rs: RopeScaling, n_rot: int) -> dict[str, tuple[int, ...]]:
    """The factor tensors a model of this scaling has, and their shapes."""
    names = {"rope_freqs": (FREQS,), "longrope": (SHORT, LONG), "": ()}[rs.factors]
    return {name: (n_rot // 2,) for name in names}

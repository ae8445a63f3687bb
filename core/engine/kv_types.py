"""The KV cache's storage types (llama.cpp's ``-ctk`` / ``-ctv``, ``--cache-type-k/v``).

A context keeps K and V in the backend's compute dtype unless told otherwise; ``f16`` and
``q8_0`` store them as llama.cpp does: ``f16`` rounds each value to float16, ``q8_0`` keeps
each 32 values along a head's row as one block (a float16 scale ``d = max|x| / 127`` and 32
int8 codes ``round(x / d)``, half away from zero: ggml's ``quantize_row_q8_0_ref``), 34
bytes per 32 values. Attention reads the stored values; writing rounds once.

This module holds what the core needs of the types: their names and sizes, the checks of a
layout against them, the numpy form of the rounding (the reference every backend's cache
must store bit for bit) and the byte encoding of state files.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.contract.arch import KVLayerLayout
from tessera.errors import TesseraError

#: Bytes per stored value of each cache type.
KV_TYPE_BYTES = {"f32": 4.0, "bf16": 2.0, "f16": 2.0, "q8_0": 34 / 32}
#: Values per q8_0 block, and its bytes (a float16 scale, then 32 int8 codes).
Q8_0_BLOCK, Q8_0_BYTES = 32, 34


def cache_type(name: str, dtype: str) -> str:
    """The cache type a context stores: ``name`` (any case), or the compute ``dtype`` for
    an empty one; raises TesseraError for a name that is no cache type."""
    resolved = (name or dtype).lower()
    if resolved not in KV_TYPE_BYTES:
        raise TesseraError(
            f"unknown KV cache type '{name}'; use one of {', '.join(KV_TYPE_BYTES)} "
            "(-ctk / -ctv, as llama.cpp)"
        )
    return resolved


def check_layout(layout: Sequence[KVLayerLayout | None], type_k: str, type_v: str) -> None:
    """Refuse cache types a model's layout cannot store: q8_0 needs head sizes that are whole
    blocks of 32, and a V held inside K (``v_in_k``) has K's type."""
    for L in layout:
        if L is None:
            continue
        for what, kind, dim in (("K", type_k, L.head_dim_k), ("V", type_v, L.head_dim_v)):
            if kind == "q8_0" and dim % Q8_0_BLOCK:
                raise TesseraError(
                    f"a q8_0 {what} cache needs head sizes that are multiples of "
                    f"{Q8_0_BLOCK}; this model's {what} heads have {dim} values: use "
                    f"-ct{what.lower()} f16"
                )
        if L.v_in_k and type_k == "q8_0":
            raise TesseraError(
                "this model keeps V inside its K cache, which q8_0 cannot store; use -ctk f16"
            )
        if L.v_in_k and type_v != type_k:
            raise TesseraError(
                f"this model keeps V inside its K cache, so both have K's type ({type_k}); "
                f"drop -ctv {type_v} or give -ctv {type_k}"
            )


def _round_half_away(v: np.ndarray) -> np.ndarray:
    # floor(|v|) plus one when the fraction is >= 0.5, in exact float32 steps (trunc(|v| +
    # 0.5) would round twice); ggml's roundf, infinities and NaNs propagating as in ggml
    a = np.abs(v)
    whole = np.floor(a)
    return np.sign(v) * (whole + np.floor(2 * (a - whole)))


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float32 rows ``(..., D)`` (D a multiple of 32) as q8_0 bytes ``(..., D / 32 * 34)``,
    as ggml's reference quantizer (the Q8_0 quant type's codec too)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = x.reshape(-1, Q8_0_BLOCK)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = _round_half_away(blocks * inv).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // Q8_0_BLOCK * Q8_0_BYTES)


def dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    """q8_0 bytes ``(..., n * 34)`` as the float32 values ``(..., n * 32)`` they hold."""
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, Q8_0_BYTES)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(*b.shape[:-1], b.shape[-1] // Q8_0_BYTES * Q8_0_BLOCK)


def stored_values(x: np.ndarray, kind: str) -> np.ndarray:
    """The float32 values a ``kind`` cache holds after ``x`` (float32 rows) is written."""
    x = np.asarray(x, dtype=np.float32)
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        bits = np.ascontiguousarray(x).view(np.uint32)  # round to nearest even, as torch
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if kind == "q8_0":
        return dequantize_q8_0(quantize_q8_0(x))
    return x


def encode(values: np.ndarray, kind: str, dtype: str) -> np.ndarray:
    """The state-file bytes of a ``kind`` cache's rows (float32 ``values``, what it holds):
    float16 for f16, the blocks for q8_0 (both exact: the values re-round to themselves),
    float32 for the compute ``dtype`` and f32 (as format 1 stored every cache)."""
    if kind == "q8_0":
        return quantize_q8_0(values).view(np.uint8)
    if kind == "f16" and dtype != "f16":
        return np.ascontiguousarray(values, dtype="<f2").view(np.uint8)
    return np.ascontiguousarray(values, dtype="<f4").view(np.uint8)


def encoded_bytes(n_values: int, kind: str, dtype: str) -> int:
    """Bytes :func:`encode` gives for ``n_values`` values of a ``kind`` cache."""
    if kind == "q8_0":
        return n_values // Q8_0_BLOCK * Q8_0_BYTES
    return n_values * (2 if kind == "f16" and dtype != "f16" else 4)


def decode(data: np.ndarray, kind: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of :func:`encode`'s bytes ``data``, as ``shape``."""
    if kind == "q8_0":
        return dequantize_q8_0(data.reshape(*shape[:-1], -1)).reshape(shape)
    if kind == "f16" and dtype != "f16":
        return data.view("<f2").astype(np.float32).reshape(shape)
    return data.view("<f4").reshape(shape)

"""ggml's ``make_qkx2_quants`` (a scale and a min per group, by weighted least squares)
and the super-block quantizer Q4_K and Q5_K share around it; Q2_K uses it too.

Not an entry point; q2_k, q4_k and q5_k import it. Arrays are laid out with each group's
values down a column, ``(group, n_groups)``: the in-order float32 sums the C code does per
group are then row additions (:func:`~tessera.plugins.quant.kquant_common.column_sum`),
vectorized over all groups. Only the trial scales are a Python loop.
"""

from __future__ import annotations

import numpy as np

from tessera.plugins.quant.kquant_common import (
    F32,
    QK_K,
    column_sum,
    fp16_bytes,
    fp16_value,
    nearest_int,
)
from tessera.plugins.quant.kquant_layout import pack_k4_scales


def make_qkx2_quants(
    x: np.ndarray,
    w: np.ndarray,
    nmax: int,
    rmin: float,
    rdelta: float,
    nstep: int,
    use_mad: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants(group, nmax, x, w, ..., rmin, rdelta, nstep, use_mad)`` for every
    column of ``x`` (weights ``w``, same shape ``(group, n)``).

    The first fit maps ``[min(x, 0), max(x)]`` onto ``0..nmax``; then each trial ``k`` of
    ``0..nstep`` rounds with the scale ``(nmax + rmin + rdelta * k) / (max - min)``, refits
    scale and min by weighted least squares (the min clamped to <= 0) and is kept if its
    weighted error (squared, or absolute with ``use_mad``) is smaller. A trial's range uses
    the best min found so far, as the C code does. Returns the scales ``(n,)``, the mins as
    ``-min`` (>= 0) ``(n,)`` and the codes ``(group, n)`` 0..nmax, all float32.
    """
    lo = np.minimum(x.min(axis=0), F32(0))
    hi = x.max(axis=0)
    flat = hi == lo
    sum_w = column_sum(w)
    sum_x = column_sum(w * x)
    top = F32(nmax)

    def error(scale: np.ndarray, low: np.ndarray, codes: np.ndarray) -> np.ndarray:
        diff = scale * codes + low - x
        return column_sum(w * (np.abs(diff) if use_mad else diff * diff))

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = top / (hi - lo)
        scale = F32(1) / iscale
        codes = np.clip(nearest_int(iscale * (x - lo)), 0, top)
        best = error(scale, lo, codes)
        for step in range(nstep + 1):
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + top) / (hi - lo)
            trial = np.clip(nearest_int(iscale * (x - lo)), 0, top)
            wl = w * trial
            sum_l, sum_l2, sum_xl = column_sum(wl), column_sum(wl * trial), column_sum(wl * x)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_min = np.where(positive, F32(0), this_min)
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale).astype(F32)
            this_error = error(this_scale, this_min, trial)
            better = (det > 0) & (this_error < best) & ~flat
            codes = np.where(better, trial, codes)
            best = np.where(better, this_error, best)
            scale = np.where(better, this_scale, scale)
            lo = np.where(better, this_min, lo)
    scale = np.where(flat, F32(0), scale)
    codes = np.where(flat, F32(0), codes)
    return scale.astype(F32), (-lo).astype(F32), codes


def six_bits(values: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Group scales (or mins) ``(nb, 8)`` as 6-bit integers against their super-block's
    largest ``top`` ``(nb,)``, as ggml: ``uint8_t l = nearest_int(63 / top * v)``, capped
    at 63 (the cast to uint8 wraps first)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(top > 0, F32(63) / top, F32(0))
        return np.minimum(nearest_int(inv[:, None] * values).astype(np.int32) & 255, 63).astype(
            np.uint8
        )


def quantize_k4(
    x: np.ndarray, nmax: int, rmin: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The Q4_K / Q5_K quantizer (``quantize_row_q4_K_ref`` / ``q5_K``) up to the packing
    of the codes: 8 groups of 32 per super-block, each fitted by :func:`make_qkx2_quants`
    (weights ``rms(group) + |x|``, ``rdelta`` 0.1), scales and mins quantized to 6 bits
    against the largest of each, then every group rounded again with those.

    Returns ``d`` and ``dmin`` as float16 bytes ``(nb, 2)``, the 12 scale bytes ``(nb, 12)``
    and the codes ``(nb, 256)`` uint8 0..nmax.
    """
    columns = np.ascontiguousarray(x.reshape(-1, 32).T)
    av_x = np.sqrt(column_sum(columns * columns) / F32(32))
    scales, mins, codes = make_qkx2_quants(columns, av_x + np.abs(columns), nmax, rmin, 0.1, nstep)
    nb = scales.size // 8
    scales, mins = scales.reshape(nb, 8), mins.reshape(nb, 8)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    ls, lm = six_bits(scales, max_scale), six_bits(mins, max_min)
    d16, dmin16 = fp16_bytes(max_scale / F32(63)), fp16_bytes(max_min / F32(63))
    d = fp16_value(d16) * ls.astype(F32)
    dm = fp16_value(dmin16) * lm.astype(F32)
    blocks = x.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        requant = np.clip(nearest_int((blocks + dm[..., None]) / d[..., None]), 0, F32(nmax))
    first = codes.T.reshape(blocks.shape)
    codes = np.where((d != 0)[..., None], requant, first).astype(np.uint8)
    return d16, dmin16, pack_k4_scales(ls, lm), codes.reshape(nb, QK_K)

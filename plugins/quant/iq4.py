"""IQ4_NL and IQ4_XS: 4-bit codes into a non-linear table of 16 values, bit-exact with llama.cpp.

The codes index ggml's ``kvalues_iq4nl`` (-127 ... 113, denser near zero; the format's
table, taken from ``gguf.quants.IQ4_NL.kvalues`` at import); value = ``scale * table[code]``.

- **IQ4_NL** (32 values, 18 bytes): ``d`` (float16) then 16 bytes, low nibble value ``j``,
  high nibble value ``j + 16``; scale = ``d``.
- **IQ4_XS** (256 values, 136 bytes): ``d`` (float16), ``scales_h`` (uint16: 2 high bits of
  each group's 6-bit scale), ``scales_l`` (4 bytes: low nibbles, group ``2i`` low, ``2i+1``
  high), then 128 bytes of codes, 16 per group of 32 packed as in IQ4_NL; scale of group
  ``g`` = ``d * (ls_g - 32)``.

The quantizer is ggml's ``quantize_row_iq4_nl_impl`` as ``llama-quantize`` runs it without an
importance matrix (``ntry = 7``), vectorized over all groups of 32: weights ``x**2``; a
first scale ``max / 127`` (``max``: the value of largest magnitude, sign kept) refitted by
least squares; then 15 trial scales ``max / (k - 127)``, k = -7..7, each refitted, kept
when ``sumqx**2 / sumq2`` grows. Codes are the nearest table entries (ggml's
``best_index_int8``). IQ4_NL stores the group scale; IQ4_XS scales the groups by
``d = -max_scale / 32`` and 6-bit integers and re-picks the codes against those. Float32
throughout; each group's sums in C's order, with the groups down the columns
(:func:`~tessera.plugins.quant.kquant_common.column_sum`).
"""

from __future__ import annotations

import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import (
    F32,
    GROUP_MAX_EPS,
    QK_K,
    column_sum,
    fp16_bytes,
    nearest_int,
)
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

#: ggml's kvalues_iq4nl (the format's table, from gguf), ascending.
KVALUES = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int8)
VALUES = KVALUES.astype(F32)
GROUP = 32
NL_SIZE = 2 + GROUP // 2
XS_GROUPS = QK_K // GROUP
XS_SIZE = 2 + 2 + XS_GROUPS // 2 + QK_K // 2
#: ``ntry`` of llama-quantize's calls: trial scales k = -7..7 around the first one.
NTRY = 7


def _index_table() -> np.ndarray:
    halves = np.arange(-256, 257) / 2
    midpoints = (VALUES[:-1].astype(np.float64) + VALUES[1:]) / 2
    return np.searchsorted(midpoints, halves, side="right").astype(np.uint8)


#: Code of the nearest table entry for ``x`` in ``[k/2, (k+1)/2)``, at ``k + 256``.
INDEX_BY_HALF = _index_table()


def best_index(x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, x)``: the nearest table entry, the upper
    one on a tie (NaN gives 15).

    ggml compares ``x - lo < hi - x`` in float32; near a midpoint both differences are
    exact, so the answer is ``x < (lo + hi) / 2``, and the midpoints being multiples of 1/2,
    ``floor(2x)`` decides it through a table (tests compare with ggml's comparison).
    """
    with np.errstate(over="ignore"):
        # fmin turns NaN into the top of the range; then clamp below.
        halves = np.maximum(np.fmin(x * F32(2), F32(256)), F32(-256))
    return INDEX_BY_HALF[np.floor(halves).astype(np.int32) + 256]


def first_largest(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first value of largest magnitude and that magnitude, NaNs skipped, as
    C's ``if (fabsf(v) > amax)`` scan from 0 finds them (0, 0 for a row without any)."""
    magnitude = np.abs(values)
    magnitude = np.where(np.isnan(magnitude), F32(0), magnitude)
    pick = np.argmax(magnitude, axis=1)[:, None]
    amax = np.take_along_axis(magnitude, pick, axis=1)[:, 0]
    peak = np.where(amax > 0, np.take_along_axis(values, pick, axis=1)[:, 0], F32(0))
    return peak.astype(F32), amax


def _sums(xt: np.ndarray, wt: np.ndarray, inv_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``sumqx``, ``sumq2`` per group of the codes picked at ``inv_scale``; values and
    weights are transposed, ``(32, n_groups)``."""
    q = VALUES[best_index(inv_scale * xt)]
    wq = wt * q
    return column_sum(wq * xt), column_sum(wq * q)


def group_scales(x: np.ndarray) -> np.ndarray:
    """The scale of each row of 32 values that ggml's search ends with (0 for an all-zero
    row, below ``GROUP_MAX_EPS``)."""
    peak, amax = first_largest(x)
    zero = amax < GROUP_MAX_EPS
    xt = np.ascontiguousarray(x.T)  # group-minor: the sums over 32 become 31 vector adds
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        wt = xt * xt
        d = -peak / VALUES[0]
        sumqx, sumq2 = _sums(xt, wt, F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0)).astype(F32)
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            sumqx, sumq2 = _sums(xt, wt, F32(itry + int(KVALUES[0])) / peak)
            better = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            d = np.where(better, sumqx / sumq2, d)
            best = np.where(better, d * sumqx, best)
    return np.where(zero, F32(0), d).astype(F32)


def _inverse(d: np.ndarray) -> np.ndarray:
    """``d ? 1/d : 0``, as ggml."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0)).astype(F32)


def _pack_groups(codes: np.ndarray) -> np.ndarray:
    """Codes ``(n, 32)``: value ``j`` in the low nibble of byte ``j``, ``j + 16`` high."""
    return codes[:, :16] | codes[:, 16:] << 4


def quantize_nl(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    groups = x.reshape(-1, GROUP)
    d = group_scales(groups)
    with np.errstate(invalid="ignore", over="ignore"):
        codes = best_index(_inverse(d)[:, None] * groups)
    out = np.concatenate([fp16_bytes(d), _pack_groups(codes)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // GROUP * NL_SIZE)


def quantize_xs(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    groups = x.reshape(-1, GROUP)
    scales = group_scales(groups).reshape(-1, XS_GROUPS)
    d = -first_largest(scales)[0] / F32(32)
    with np.errstate(invalid="ignore", over="ignore"):
        ls = np.clip(nearest_int(_inverse(d)[:, None] * scales), -32, 31)
        dl = (d[:, None] * ls.astype(F32)).reshape(-1)
        codes = best_index(_inverse(dl)[:, None] * groups)
    ls = (ls + 32).astype(np.uint16)
    scales_h = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(XS_GROUPS, dtype=np.uint16)), 1)
    low = (ls & 15).astype(np.uint8)
    scales_l = low[:, 0::2] | low[:, 1::2] << 4
    qs = _pack_groups(codes).reshape(len(d), -1)
    h_bytes = scales_h.astype("<u2").reshape(-1, 1).view(np.uint8)
    out = np.concatenate([fp16_bytes(d), h_bytes, scales_l, qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * XS_SIZE)


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view("<f2").astype(F32)


def dequantize_nl(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, NL_SIZE)
    qs = blocks[:, 2:]
    values = VALUES[np.concatenate([qs & 15, qs >> 4], axis=1)]
    with np.errstate(invalid="ignore", over="ignore"):
        out = _f16(blocks[:, :2]) * values
    return out.reshape(*b.shape[:-1], b.shape[-1] // NL_SIZE * GROUP)


def dequantize_xs(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, XS_SIZE)
    d = _f16(blocks[:, :2])
    scales_h = blocks[:, 2:4].copy().view("<u2")
    high = (scales_h >> (2 * np.arange(XS_GROUPS, dtype=np.uint16))) & 3
    low = np.stack([blocks[:, 4:8] & 15, blocks[:, 4:8] >> 4], axis=2).reshape(-1, XS_GROUPS)
    ls = (low | high << 4).astype(np.int32) - 32
    qs = blocks[:, 8:].reshape(-1, XS_GROUPS, 16)
    values = VALUES[np.concatenate([qs & 15, qs >> 4], axis=2)]
    with np.errstate(invalid="ignore", over="ignore"):
        out = (d * ls.astype(F32))[..., None] * values
    return out.reshape(*b.shape[:-1], b.shape[-1] // XS_SIZE * QK_K)


IQ4_NL = QuantType(
    "IQ4_NL", int(GGMLQuantizationType.IQ4_NL), GROUP, NL_SIZE, quantize_nl, dequantize_nl
)
IQ4_XS = QuantType(
    "IQ4_XS", int(GGMLQuantizationType.IQ4_XS), QK_K, XS_SIZE, quantize_xs, dequantize_xs
)


@hookimpl
def tessera_register_quant_types(register):
    register(IQ4_NL)
    register(IQ4_XS)


@hookimpl
def tessera_register_weight_kernels(register):
    # no torch kernel of their own: without the native kernels they dequantize at load
    register(with_native(IQ4_NL, None))
    register(with_native(IQ4_XS, None))

"""Q3_K: super-blocks of 256 3-bit codes in 16 groups of 16, bit-exact with llama.cpp.

Block layout (110 bytes): ``hmask`` (32 bytes: the third bit of value ``v`` is bit ``v //
32`` of ``hmask[v % 32]``), 64 bytes of the low 2 bits
(:func:`~tessera.plugins.quant.kquant_layout.pack_2bit`), 12 bytes of 6-bit signed group
scales ``sc`` (stored ``sc + 32``: the low nibbles of groups 0-7 and 8-15 in the low and
high nibbles of bytes 0-7, the top two bits of group ``j`` in bits ``2 * (j // 4)`` of
byte ``8 + j % 4``), then ``d`` (float16). value = ``d * sc * (q - 4)``, q 0..7.

The quantizer is llama.cpp's reference one (``quantize_row_q3_K_ref``, no importance
matrix): each group of 16 gets the scale of ggml's ``make_q3_quants`` with ``do_rmse``
(codes round ``-4 / v * x`` for ``v`` the value of largest magnitude, then up to 5 sweeps
that move single codes while that improves the weighted least-squares fit, weights
``x**2``), the group scales are quantized to 6 bits against the one of largest magnitude,
then every group is rounded again with those. Vectorized over all groups; the sweeps are
a Python loop over the 5 x 16 code positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import (
    F32,
    GROUP_MAX_EPS,
    QK_K,
    column_sum,
    first_argmax,
    fp16_bytes,
    fp16_value,
    nearest_int,
    torch_grouped_kernel,
    torch_grouped_weight,
)
from tessera.plugins.quant.kquant_layout import pack_2bit, unpack_2bit
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

TYPE_SIZE = QK_K // 8 + QK_K // 4 + 12 + 2
GROUP = 16
NMAX = 4
N_GROUPS = QK_K // GROUP
SWEEPS = 5
#: Bit ``k`` of ``hmask`` belongs to the values ``32 k .. 32 k + 31``.
BIT_OF_ROW = np.arange(8, dtype=np.uint8)[:, None]


def _signed_codes(values: np.ndarray) -> np.ndarray:
    return np.clip(nearest_int(values), -NMAX, NMAX - 1)


def make_q3_quants(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants(16, 4, x, L, true)`` for every column of ``x`` ``(16, n)``.

    Returns the scales ``(n,)`` and the codes ``(16, n)`` 0..7 as float32. A group whose
    largest magnitude is below ggml's GROUP_MAX_EPS gets scale 0 and codes 0.
    """
    peak = np.take_along_axis(x, first_argmax(np.abs(x).T)[None, :], axis=0)[0]
    w = x * x
    wx = w * x  # (w * x) * l is the C code's w*x[i]*l
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        codes = _signed_codes((F32(-NMAX) / peak) * x)
        sumlx, suml2 = column_sum(wx * codes), column_sum(w * codes * codes)
        for _ in range(SWEEPS):
            changed = np.zeros(x.shape[1], bool)
            for i in range(GROUP):
                old, wi = codes[i], w[i]
                slx = sumlx - wx[i] * old
                sl2 = suml2 - wi * old * old
                new = _signed_codes(x[i] * sl2 / slx)
                slx_new = slx + wx[i] * new
                sl2_new = sl2 + wi * new * new
                take = (slx > 0) & (new != old) & (sl2_new > 0)
                take &= slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new
                codes[i] = np.where(take, new, old)
                sumlx = np.where(take, slx_new, sumlx)
                suml2 = np.where(take, sl2_new, suml2)
                changed |= take
            if not changed.any():  # a group without a change stops changing
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0)).astype(F32)
    zero = np.abs(peak) < GROUP_MAX_EPS
    return np.where(zero, F32(0), scale), np.where(zero, F32(0), codes + F32(NMAX))


def _scale_bytes(levels: np.ndarray) -> np.ndarray:
    """6-bit stored scales ``(nb, 16)`` as the 12 scale bytes."""
    low = levels & 15
    high = (levels >> 4).reshape(-1, 4, 4)  # (j // 4, j % 4)
    top = high[:, 0] | high[:, 1] << 2 | high[:, 2] << 4 | high[:, 3] << 6
    return np.concatenate([low[:, :8] | low[:, 8:] << 4, top], axis=1)


def _scale_levels(s: np.ndarray) -> np.ndarray:
    """The 12 scale bytes as signed group scales ``(nb, 16)`` int8 (-32..31)."""
    low = np.concatenate([s[:, :8] & 15, s[:, :8] >> 4], axis=1)
    high = s[:, 8:12].reshape(-1, 1, 4) >> (2 * np.arange(4, dtype=np.uint8))[:, None] & 3
    return (low | high.reshape(-1, N_GROUPS) << 4).astype(np.int8) - np.int8(32)


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    scales, first = make_q3_quants(np.ascontiguousarray(x.reshape(-1, GROUP).T))
    nb = scales.size // N_GROUPS
    scales = scales.reshape(nb, N_GROUPS)
    max_scale = np.take_along_axis(scales, first_argmax(np.abs(scales))[:, None], axis=1)[:, 0]
    nonzero = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-32) / max_scale
        # C keeps nearest_int's result in an int8_t (wrapping), then clamps to -32..31
        levels = nearest_int(iscale[:, None] * scales).astype(np.int32).astype(np.int8)
        levels = np.clip(levels, -32, 31).astype(np.uint8) + np.uint8(32)
        d16 = fp16_bytes(np.where(nonzero, F32(1) / iscale, F32(0)))
    scale_bytes = np.where(nonzero[:, None], _scale_bytes(levels), np.uint8(0))
    d = fp16_value(d16) * _scale_levels(scale_bytes).astype(F32)
    blocks = x.reshape(nb, N_GROUPS, GROUP)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        requant = _signed_codes(blocks / d[..., None]) + F32(NMAX)
    codes = np.where((d != 0)[..., None], requant, first.T.reshape(blocks.shape))
    codes = codes.astype(np.uint8).reshape(nb, QK_K)
    high = codes > 3
    hmask = np.bitwise_or.reduce(high.reshape(nb, 8, 32).astype(np.uint8) << BIT_OF_ROW, axis=1)
    qs = pack_2bit(codes - 4 * high.astype(np.uint8))
    out = np.concatenate([hmask, qs, scale_bytes, d16], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TYPE_SIZE)


def unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group scales ``d * sc`` ``(nb, 16)`` float32 and signed codes ``(nb, 256)`` int8
    (-4..3) of Q3_K bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    nb = blocks.shape[0]
    hmask = blocks[:, :32].reshape(nb, 1, 32)
    low = unpack_2bit(blocks[:, 32:96]).astype(np.int8)
    # a clear hmask bit means q - 4 (llama.cpp subtracts 4 where the bit is 0)
    minus_four = ((hmask >> BIT_OF_ROW & 1) ^ 1).reshape(nb, QK_K).astype(np.int8) << 2
    scale = fp16_value(blocks[:, 108:110]) * _scale_levels(blocks[:, 96:108]).astype(F32)
    return scale, low - minus_four


def dequantize(b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # a stored scale may be infinite or NaN
        scale, codes = unpack(b)
        values = scale[..., None] * codes.reshape(-1, N_GROUPS, GROUP).astype(F32)
    return values.reshape(*b.shape[:-1], b.shape[-1] // TYPE_SIZE * QK_K)


Q3_K = QuantType("Q3_K", int(GGMLQuantizationType.Q3_K), QK_K, TYPE_SIZE, quantize, dequantize)


def load_torch(backend: Any, raw: Any) -> Any:
    """Signed 3-bit codes as int8 plus one scale ``d * sc`` per group of 16."""
    n_out = raw.shape[0]
    scale, codes = unpack(np.asarray(raw.data).reshape(n_out, -1))
    return torch_grouped_weight(
        backend, codes.reshape(n_out, -1, GROUP), scale.reshape(n_out, -1, 1), None
    )


@hookimpl
def tessera_register_quant_types(register):
    register(Q3_K)


@hookimpl
def tessera_register_weight_kernels(register):
    grouped = torch_grouped_kernel(
        Q3_K, load_torch, "int8 codes + scale per 16, dequantized per matmul"
    )
    register(with_native(Q3_K, grouped))

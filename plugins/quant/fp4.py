"""MXFP4 and NVFP4: 4-bit E2M1 floats with a shared per-block scale, bit-exact with llama.cpp.

Both store E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6)
as doubled integers (0, 1, 2, 3, 4, 6, 8, 12 and their negatives; codes 8..15 are the
negatives of 0..7), so the scale read from a block is half the OCP one. The value table
is the format's, taken from ``gguf.quants.MXFP4.kvalues`` at import.

- **MXFP4** (OCP microscaling; 32 values, 17 bytes): an E8M0 exponent byte ``e`` then 16
  bytes whose low nibble is value ``j`` and high nibble value ``j + 16``;
  value = ``code * 2**(e - 128)`` (ggml's ``GGML_E8M0_TO_FP32_HALF``; ``e`` 0 and 1 are the
  float32 subnormals 2**-128 and 2**-127). The quantizer takes
  ``e = floor(log2(max|x|)) - 2 + 127``.
- **NVFP4** (64 values, 36 bytes): four UE4M3 scales (unsigned E4M3, bias 7, for the four
  sub-blocks of 16), then 32 bytes, 8 per sub-block, low nibble value ``j`` and high nibble
  ``j + 8``; value = ``code * ue4m3(s) / 2``. Scale bytes 0x00 and 0x7F read as 0 and the
  top bit is ignored, as ggml's ``ggml_ue4m3_to_fp32``. The quantizer takes
  ``s = ue4m3(max|x| / 6)`` rounding as ggml's ``ggml_fp32_to_ue4m3`` (round half up on
  the fourth mantissa bit, saturating at 448).

Both quantizers then pick, per value, the code of the smallest ``|code * d - x|`` (first
one on ties, as ggml's ``best_index_mxfp4``); NaNs in a block are ignored when its
largest magnitude is taken, as ggml's ``amax < fabsf(v)`` test does.
"""

from __future__ import annotations

import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import F32
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

#: E2M1 values doubled, by code (the format's table, from gguf).
KVALUES = np.array(gguf.quants.MXFP4.kvalues, dtype=np.int8)
#: The non-negative half, by code 0..7; codes 8..15 are their negatives.
MAGNITUDES = KVALUES[:8].astype(F32)

MXFP4_BLOCK = 32
MXFP4_SIZE = 1 + MXFP4_BLOCK // 2
NVFP4_BLOCK = 64
NVFP4_SUB = 16
NVFP4_SIZE = NVFP4_BLOCK // NVFP4_SUB + NVFP4_BLOCK // 2


def _e8m0_half_table() -> np.ndarray:
    e = np.arange(256, dtype=np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _ue4m3_half_table() -> np.ndarray:
    b = np.arange(256)
    exp, man = (b >> 3) & 15, (b & 7).astype(np.float64)
    raw = np.where(exp == 0, man * 2.0**-9, (1 + man / 8) * 2.0 ** (exp - 7))
    return np.where((b == 0) | (b == 0x7F), 0.0, raw * 0.5).astype(F32)  # all exact


#: Scale byte -> float32 scale (already halved for the doubled codes).
E8M0_HALF = _e8m0_half_table()
UE4M3_HALF = _ue4m3_half_table()


def _block_amax(blocks: np.ndarray) -> np.ndarray:
    """Largest magnitude per row, NaNs ignored (0 for a row of NaNs)."""
    magnitude = np.abs(blocks)
    return np.where(np.isnan(magnitude), F32(0), magnitude).max(axis=-1)


def _codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_mxfp4`` for every value: ``d`` broadcasts against ``x``.

    ``|(-k)d - x|`` is exactly ``|k d - |x||`` for ``x < 0``, so the search runs over the
    eight magnitudes and a negative value takes the negative code (8 + i) unless the best
    is 0, where code 0 comes first; a NaN keeps code 0, as in C.
    """
    a = np.abs(x)
    best = np.abs(MAGNITUDES[0] * d - a)
    index = np.zeros(x.shape, np.uint8)
    for i in range(1, 8):
        err = np.abs(MAGNITUDES[i] * d - a)
        better = err < best
        best = np.where(better, err, best)
        index[better] = i
    return np.where((x < 0) & (index > 0), index + 8, index).astype(np.uint8)


def _pack_halves(codes: np.ndarray) -> np.ndarray:
    """Codes ``(..., n)``: value ``j`` in the low nibble of byte ``j``, ``j + n/2`` high."""
    half = codes.shape[-1] // 2
    return codes[..., :half] | codes[..., half:] << 4


def _unpack_halves(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def mxfp4_exponent(amax: np.ndarray) -> np.ndarray:
    """ggml's ``(uint8_t)(floorf(log2f(amax)) - 2 + 127)``, 0 for ``amax == 0``.

    log2 is taken in float64 and rounded to float32, as a correctly rounded ``log2f``: one
    ulp below a power of two 2**k (k >= 3 or k <= -2) it rounds up to k, which ``floor``
    keeps.
    """
    with np.errstate(divide="ignore"):
        log2 = np.log2(amax.astype(np.float64)).astype(F32)
    e = np.where(amax > 0, np.floor(log2) - F32(2) + F32(127), F32(0))
    return (e.astype(np.int32) & 0xFF).astype(np.uint8)  # x86's float -> uint8 wraps


def quantize_mxfp4(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    blocks = x.reshape(-1, MXFP4_BLOCK)
    e = mxfp4_exponent(_block_amax(blocks))
    with np.errstate(over="ignore", invalid="ignore"):
        qs = _pack_halves(_codes(blocks, E8M0_HALF[e][:, None]))
    out = np.concatenate([e[:, None], qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // MXFP4_BLOCK * MXFP4_SIZE)


def dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, MXFP4_SIZE)
    values = KVALUES[_unpack_halves(blocks[:, 1:])].astype(F32)
    with np.errstate(over="ignore"):
        out = E8M0_HALF[blocks[:, :1]] * values
    return out.reshape(*b.shape[:-1], b.shape[-1] // MXFP4_SIZE * MXFP4_BLOCK)


def fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_fp32_to_ue4m3`` for float32 ``x`` (NaN and values <= 0 give 0)."""
    x = np.minimum(np.where(x > 0, x, F32(0)), F32(448)).astype(F32)
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    # Subnormal UE4M3 (exp <= 0): man = (int)(x * 512 + 0.5), in float32 as in C.
    sub = np.minimum((x * F32(512) + F32(0.5)).astype(np.int32), 7)
    man = ((bits >> 20) & 7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    carry = man > 7
    exp, man = np.where(carry, exp + 1, exp), np.where(carry, 0, man)
    normal = np.where(exp >= 15, 0x7E, exp << 3 | man)
    return np.where(x > 0, np.where(exp - carry <= 0, sub, normal), 0).astype(np.uint8)


def quantize_nvfp4(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    subs = x.reshape(-1, NVFP4_BLOCK // NVFP4_SUB, NVFP4_SUB)
    scales = fp32_to_ue4m3(_block_amax(subs) / F32(6))
    qs = _pack_halves(_codes(subs, UE4M3_HALF[scales][..., None]))
    out = np.concatenate([scales, qs.reshape(len(subs), -1)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // NVFP4_BLOCK * NVFP4_SIZE)


def dequantize_nvfp4(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    n_sub = NVFP4_BLOCK // NVFP4_SUB
    blocks = b.reshape(-1, NVFP4_SIZE)
    qs = blocks[:, n_sub:].reshape(-1, n_sub, NVFP4_SUB // 2)
    values = KVALUES[_unpack_halves(qs)].astype(F32)
    out = UE4M3_HALF[blocks[:, :n_sub, None]] * values
    return out.reshape(*b.shape[:-1], b.shape[-1] // NVFP4_SIZE * NVFP4_BLOCK)


MXFP4 = QuantType(
    "MXFP4",
    int(GGMLQuantizationType.MXFP4),
    MXFP4_BLOCK,
    MXFP4_SIZE,
    quantize_mxfp4,
    dequantize_mxfp4,
)
NVFP4 = QuantType(
    "NVFP4",
    int(GGMLQuantizationType.NVFP4),
    NVFP4_BLOCK,
    NVFP4_SIZE,
    quantize_nvfp4,
    dequantize_nvfp4,
)


@hookimpl
def tessera_register_quant_types(register):
    register(MXFP4)
    register(NVFP4)


@hookimpl
def tessera_register_weight_kernels(register):
    # no torch kernels of their own: without the native kernels both dequantize at load
    register(with_native(MXFP4, None))
    register(with_native(NVFP4, None))

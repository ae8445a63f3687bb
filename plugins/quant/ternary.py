"""TQ1_0 and TQ2_0: ternary weights (-1, 0, 1 times one float16 scale per 256 values),
bit-exact with llama.cpp.

Both quantize as ggml's reference: ``d = max|x|`` and each value to ``round(x / d)`` (half
away from zero), stored as a trit ``t = q + 1`` in 0..2; value = ``(t - 1) * d``.

- **TQ2_0** (66 bytes): 64 bytes of 2-bit trits then ``d``. For each 128 values, byte
  ``m`` holds values ``m + 32 n`` (n = 0..3) in bits ``2n``.
- **TQ1_0** (54 bytes, 1.69 bits per weight): 48 bytes of five trits each, 4 bytes of four
  trits each, then ``d``. The first 32 bytes hold values ``m + 32 n`` of the first 160
  (n = 0..4), the next 16 bytes values ``160 + m + 16 n`` of the next 80, and the last 4
  bytes values ``240 + j + 4 n`` (n = 0..3). The trits form a base-3 number, first value
  most significant (four-trit bytes get a fifth, zero, trit), stored as the fixed-point
  fraction ``ceil(number * 256 / 243)``: the trit ``n`` is then read back as
  ``(byte * 3**n mod 256) * 3 >> 8``.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import F32, QK_K, fp16_bytes
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

TQ1_SIZE = 48 + 4 + 2
TQ2_SIZE = QK_K // 4 + 2
#: TQ1_0's byte groups: (first value, bytes, trits per byte) of the 160, 80 and 16 values.
TQ1_PARTS = ((0, 32, 5), (160, 16, 5), (240, 4, 4))
POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block of 256: the scale ``max|x|`` (float32) and trits 0..2 ``(n, 256)``."""
    blocks = x.reshape(-1, QK_K)
    d = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = blocks * np.where(d != 0, F32(1) / d, F32(0))[:, None]
        # lroundf: half away from zero; the fraction v - trunc(v) is exact in float32.
        whole = np.trunc(v)
        q = whole + np.sign(v) * (np.abs(v - whole) >= F32(0.5))
    # A subnormal max|x| makes 1/d infinite: x * inf is not finite, lroundf gives LONG_MIN
    # and ggml's ``(int)(lroundf(v) + 1)`` keeps its low bits, 1: the trit of 0.
    q = np.where(np.isfinite(v), q, F32(0))
    return d, (q + 1).astype(np.uint8)


def quantize_tq1(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    d, trits = _trits(x)
    parts = []
    for start, n_bytes, n_trits in TQ1_PARTS:
        group = trits[:, start : start + n_bytes * n_trits].reshape(-1, n_trits, n_bytes)
        # Base 3, first value most significant; a four-trit byte gets a zero fifth trit
        # (its weights 81, 27, 9, 3 are the five-trit ones without the last).
        number = (group.astype(np.uint16) * POW3[::-1][:n_trits, None]).sum(axis=1)
        parts.append(((number * 256 + 242) // 243).astype(np.uint8))
    out = np.concatenate([*parts, fp16_bytes(d)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TQ1_SIZE)


def dequantize_tq1(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, TQ1_SIZE)
    d = blocks[:, -2:].copy().view("<f2").astype(F32)
    values, offset = [], 0
    for _, n_bytes, n_trits in TQ1_PARTS:
        packed = blocks[:, offset : offset + n_bytes, None]
        offset += n_bytes
        shifted = packed * POW3[:n_trits]  # uint8: wraps modulo 256, as ggml's
        trit = (shifted.astype(np.uint16) * 3) >> 8
        values.append(trit.transpose(0, 2, 1).reshape(len(blocks), -1))
    q = np.concatenate(values, axis=1).astype(np.int8) - 1
    with np.errstate(invalid="ignore", over="ignore"):
        out = d * q.astype(F32)
    return out.reshape(*b.shape[:-1], b.shape[-1] // TQ1_SIZE * QK_K)


def quantize_tq2(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    d, trits = _trits(x)
    group = trits.reshape(-1, 2, 4, 32)  # two halves of 128: value m + 32 n
    qs = group[:, :, 0] | group[:, :, 1] << 2 | group[:, :, 2] << 4 | group[:, :, 3] << 6
    out = np.concatenate([qs.reshape(len(d), -1), fp16_bytes(d)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TQ2_SIZE)


def dequantize_tq2(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, TQ2_SIZE)
    d = blocks[:, -2:].copy().view("<f2").astype(F32)
    qs = blocks[:, : QK_K // 4].reshape(-1, 2, 1, 32)
    trit = (qs >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    q = trit.reshape(len(blocks), QK_K).astype(np.int8) - 1
    with np.errstate(invalid="ignore", over="ignore"):
        out = d * q.astype(F32)
    return out.reshape(*b.shape[:-1], b.shape[-1] // TQ2_SIZE * QK_K)


TQ1_0 = QuantType(
    "TQ1_0", int(GGMLQuantizationType.TQ1_0), QK_K, TQ1_SIZE, quantize_tq1, dequantize_tq1
)
TQ2_0 = QuantType(
    "TQ2_0", int(GGMLQuantizationType.TQ2_0), QK_K, TQ2_SIZE, quantize_tq2, dequantize_tq2
)


@hookimpl
def tessera_register_quant_types(register):
    register(TQ1_0)
    register(TQ2_0)


@hookimpl
def tessera_register_weight_kernels(register):
    # no torch kernels of their own: without the native kernels both dequantize at load
    register(with_native(TQ1_0, None))
    register(with_native(TQ2_0, None))

"""Q6_K: super-blocks of 256 6-bit codes in 16 groups of 16, bit-exact with llama.cpp.

Block layout (210 bytes): ``ql`` (128 bytes, low 4 bits of the codes), ``qh`` (64 bytes,
high 2 bits), 16 signed 8-bit group scales, then ``d`` (float16); value =
``d * scale * (code - 32)``. Within each half of 128 values, ``ql[l]`` holds values ``l``
(low nibble) and ``l + 64`` (high nibble), ``ql[l + 32]`` values ``l + 32`` and ``l + 96``,
and ``qh[l]`` the high bits of ``l``, ``l + 32``, ``l + 64``, ``l + 96`` (2 bits each).

The quantizer is llama.cpp's reference one without an importance matrix: each group of 16
gets the scale of ggml's ``make_qx_quants`` (nmax 32, weights ``x**2``: try 19 trial scales
around ``-32 / max`` and keep the one with the best weighted least-squares fit), the group
scales are then quantized to int8 against the largest one. It is vectorized over all
groups at once; only the 19 trial scales and the 16 values of a group (sequential float32
sums, as in C) are Python loops.
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
    first_argmax,
    fp16_bytes,
    nearest_int,
    seq_sum,
    torch_grouped_kernel,
    torch_grouped_weight,
)
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

TYPE_SIZE = QK_K // 2 + QK_K // 4 + QK_K // 16 + 2
GROUP = 16
NMAX = 32


def _fit(x: np.ndarray, w: np.ndarray, iscale: np.ndarray) -> tuple[np.ndarray, ...]:
    """Codes -32..31 for ``iscale`` and the sums of make_qx_quants' least-squares fit."""
    codes = np.clip(nearest_int(iscale[:, None] * x), -NMAX, NMAX - 1)
    return codes, seq_sum(w * x * codes), seq_sum(w * codes * codes)


def group_scales(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qx_quants(16, 32, x, L, rmse_type=1, NULL)`` for each row of ``x``.

    Returns the scales ``(n,)`` and signed codes ``(n, 16)`` as float32 (-32..31). An all-zero
    group gets scale 0 and code -32 (stored byte 0), as the C code leaves ``L = 0``.
    """
    n = x.shape[0]
    max_signed = np.take_along_axis(x, first_argmax(np.abs(x))[:, None], axis=1)[:, 0]
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        codes, sumlx, suml2 = _fit(x, w, F32(-NMAX) / max_signed)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            trial = -(F32(NMAX) + F32(0.1) * F32(step)) / max_signed
            trial_codes, sumlx, suml2 = _fit(x, w, trial)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            codes = np.where(better[:, None], trial_codes, codes)
            scale = np.where(better, sumlx / suml2, scale).astype(F32)
            best = np.where(better, scale * sumlx, best).astype(F32)
    zero = np.abs(max_signed) < GROUP_MAX_EPS
    scale = np.where(zero, F32(0), scale)
    codes = np.where(zero[:, None], F32(-NMAX), codes)
    return scale, codes.reshape(n, GROUP)


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    scales, codes = group_scales(x.reshape(-1, GROUP))
    nb = scales.size // (QK_K // GROUP)
    scales = scales.reshape(nb, -1)
    blocks = x.reshape(nb, -1, GROUP)
    pick = first_argmax(np.abs(scales))
    max_scale = scales[np.arange(nb), pick]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / max_scale
        d16 = fp16_bytes(F32(1) / iscale)
        q_scales = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
        d = d16.view("<f2").astype(F32) * q_scales.astype(F32)
        requant = np.clip(nearest_int(blocks / d[..., None]), -NMAX, NMAX - 1)
        codes = np.where((d != 0)[..., None], requant, codes.reshape(blocks.shape))
    codes = (codes + NMAX).astype(np.uint8)
    zero = np.abs(max_scale) < GROUP_MAX_EPS  # the whole super-block: all bytes zero
    codes[zero], q_scales[zero], d16[zero] = 0, 0, 0
    q = codes.reshape(nb, 2, 4, 32)  # half, quarter (l, l+32, l+64, l+96), l
    ql = np.concatenate(
        [q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4, q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4],
        axis=2,
    )
    qh = q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    out = np.concatenate(
        [ql.reshape(nb, -1), qh.reshape(nb, -1), q_scales.view(np.uint8), d16], axis=1
    )
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TYPE_SIZE)


def unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``d`` ``(nb, 1)`` float32, group scales ``(nb, 16)`` int8 and codes ``(nb, 256)``
    uint8 (0..63) of Q6_K bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    nb = blocks.shape[0]
    ql = blocks[:, :128].reshape(nb, 2, 64)
    qh = blocks[:, 128:192].reshape(nb, 2, 32)
    scales = blocks[:, 192:208].view(np.int8)
    d = blocks[:, 208:].copy().view("<f2").astype(F32)
    codes = np.empty((nb, 2, 4, 32), np.uint8)
    codes[:, :, 0] = ql[:, :, :32] & 15 | (qh & 3) << 4
    codes[:, :, 1] = ql[:, :, 32:] & 15 | (qh >> 2 & 3) << 4
    codes[:, :, 2] = ql[:, :, :32] >> 4 | (qh >> 4 & 3) << 4
    codes[:, :, 3] = ql[:, :, 32:] >> 4 | (qh >> 6) << 4
    return d, scales, codes.reshape(nb, QK_K)


def dequantize(b: np.ndarray) -> np.ndarray:
    d, scales, codes = unpack(b)
    group_d = d * scales.astype(F32)  # (nb, 16): d * sc first, as ggml
    values = group_d[:, :, None] * (codes.astype(np.int16) - NMAX).astype(F32).reshape(-1, 16, 16)
    return values.reshape(*b.shape[:-1], b.shape[-1] // TYPE_SIZE * QK_K)


Q6_K = QuantType("Q6_K", int(GGMLQuantizationType.Q6_K), QK_K, TYPE_SIZE, quantize, dequantize)


def load_torch(backend: Any, raw: Any) -> Any:
    """Signed 6-bit codes as int8 plus one scale per group of 16 (``d * scale``)."""
    n_out = raw.shape[0]
    d, scales, codes = unpack(np.asarray(raw.data).reshape(n_out, -1))
    signed = (codes.astype(np.int16) - NMAX).astype(np.int8).reshape(n_out, -1, GROUP)
    return torch_grouped_weight(backend, signed, (d * scales).reshape(n_out, -1, 1), None)


@hookimpl
def tessera_register_quant_types(register):
    register(Q6_K)


@hookimpl
def tessera_register_weight_kernels(register):
    grouped = torch_grouped_kernel(
        Q6_K, load_torch, "int8 codes + scales per 16, dequantized per matmul"
    )
    register(with_native(Q6_K, grouped))

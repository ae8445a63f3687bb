"""Q4_K: super-blocks of 256 4-bit codes in 8 groups of 32, bit-exact with llama.cpp.

Block layout (144 bytes): ``d`` and ``dmin`` (float16), 12 bytes of 6-bit group scales
``sc`` and mins ``m`` (groups 0-3 in the low 6 bits of bytes 0-3 / 4-7; groups 4-7 split
into a low nibble in bytes 8-11 and two high bits in the top of bytes 0-3 / 4-7), then 128
bytes of codes: for each 64 values, byte ``l`` holds value ``l`` (low nibble) and
``l + 32`` (high nibble). value = ``d * sc * q - dmin * m``.

The quantizer is llama.cpp's reference one without an importance matrix
(:func:`~tessera.plugins.quant.kquant_fit.quantize_k4`): each group of 32 is fitted by
ggml's ``make_qkx2_quants`` (weights ``rms(x) + |x|``; 21 trial scales ``(14 + 0.1 * k) /
(max - min)``, each refitted by weighted least squares for scale and min, keeping the one
with the smallest weighted squared error); the group scales and mins are then quantized to
6 bits against the largest of each. Vectorized over all groups; only the 21 trials are a
Python loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import (
    F32,
    QK_K,
    dequantize_with_mins,
    int4_kernel,
    int4_or_grouped,
)
from tessera.plugins.quant.kquant_fit import quantize_k4
from tessera.plugins.quant.kquant_layout import unpack_k4_scales
from tessera.plugins.quant.native_weight import with_native
from tessera.switches import NUMBER, Switch

TESSERA_PLUGIN_API = 2

TYPE_SIZE = 2 + 2 + 12 + QK_K // 2
GROUP = 32
NMAX = 15
INT4_ROWS = Switch(
    "TESSERA_Q4_K_INT4_ROWS",
    "Q4_K matmuls of fewer rows (default 16, CPU bf16/f16) on torch's int4 kernel, larger "
    "ones on a dense copy; 0: only the dense copy",
    NUMBER,
    off_at=0.0,
)


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    d16, dmin16, scale_bytes, codes = quantize_k4(x, NMAX, rmin=-1.0, nstep=20)
    pairs = codes.reshape(-1, 4, 2, GROUP)
    qs = (pairs[:, :, 0] | pairs[:, :, 1] << 4).reshape(pairs.shape[0], -1)
    out = np.concatenate([d16, dmin16, scale_bytes, qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TYPE_SIZE)


def unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group scales ``d * sc`` and offsets ``dmin * m`` ``(nb, 8)`` float32, and codes
    ``(nb, 256)`` uint8 0..15, of Q4_K bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    nb = blocks.shape[0]
    d = blocks[:, 0:2].copy().view("<f2").astype(F32)
    dmin = blocks[:, 2:4].copy().view("<f2").astype(F32)
    sc, m = unpack_k4_scales(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(nb, 4, 1, 32)
    codes = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(nb, QK_K)
    return d * sc.astype(F32), dmin * m.astype(F32), codes


def dequantize(b: np.ndarray) -> np.ndarray:
    return dequantize_with_mins(b, unpack, GROUP, TYPE_SIZE)


Q4_K = QuantType("Q4_K", int(GGMLQuantizationType.Q4_K), QK_K, TYPE_SIZE, quantize, dequantize)


def load_torch(backend: Any, raw: Any, min_rows: float | None = None) -> Any:
    """4-bit codes as uint8 plus one scale and one offset per group of 32; on the CPU in
    bf16/f16 instead torch's int4 layout for decode next to a dense copy
    (:func:`~tessera.plugins.quant.kquant_common.int4_or_grouped`)."""
    n_out = raw.shape[0]
    scale, offset, codes = unpack(np.asarray(raw.data).reshape(n_out, -1))
    return int4_or_grouped(
        backend, "Q4_K", INT4_ROWS, codes.reshape(n_out, -1, GROUP), scale.reshape(n_out, -1),
        offset.reshape(n_out, -1), min_rows,
    )  # fmt: skip


@hookimpl
def tessera_register_quant_types(register):
    register(Q4_K)


@hookimpl
def tessera_register_weight_kernels(register):
    int4 = int4_kernel(
        Q4_K,
        load_torch,
        INT4_ROWS,
        "uint8 codes + scale/min per 32; CPU: int4 decode + dense prefill",
    )
    register(with_native(Q4_K, int4))


@hookimpl
def tessera_register_switches(register):
    register(INT4_ROWS)

"""Q2_K: super-blocks of 256 2-bit codes in 16 groups of 16, bit-exact with llama.cpp.

Block layout (84 bytes): 16 bytes of group scales (low nibble ``sc``, high nibble ``m``),
64 bytes of codes (:func:`~tessera.plugins.quant.kquant_layout.pack_2bit`), then ``d``
and ``dmin`` (float16); value = ``d * sc * q - dmin * m``.

The quantizer is llama.cpp's reference one (``quantize_row_q2_K_ref``, no importance
matrix): each group of 16 is fitted by ggml's ``make_qkx2_quants`` with codes 0..3, weights
``|x|`` and the absolute error (16 trial scales ``(2.5 + 0.1 * k) / (max - min)``); group
scales and mins are quantized to 4 bits against the largest of each (a super-block whose
largest is 0 keeps 0), then every group is rounded again with them. Vectorized over all
groups (:mod:`~tessera.plugins.quant.kquant_fit`).
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
    fp16_bytes,
    fp16_value,
    nearest_int,
    torch_grouped_kernel,
    torch_weight_with_mins,
)
from tessera.plugins.quant.kquant_fit import make_qkx2_quants
from tessera.plugins.quant.kquant_layout import pack_2bit, unpack_2bit
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

TYPE_SIZE = QK_K // 16 + QK_K // 4 + 2 + 2
GROUP = 16
NMAX = 3
N_GROUPS = QK_K // GROUP


def _four_bits(values: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group scales (or mins) ``(nb, 16)`` as integers ``nearest_int(15 / top * v)`` (int32,
    0 where ``top`` is not positive) and the super-block's float16 factor ``top / 15``."""
    positive = top > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        levels = nearest_int((F32(15) / top)[:, None] * values).astype(np.int32)
    levels = np.where(positive[:, None], levels, 0)
    return levels, fp16_bytes(np.where(positive, top / F32(15), F32(0)))


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    columns = np.ascontiguousarray(x.reshape(-1, GROUP).T)
    scales, mins, first = make_qkx2_quants(
        columns, np.abs(columns), NMAX, rmin=-0.5, rdelta=0.1, nstep=15, use_mad=True
    )
    nb = scales.size // N_GROUPS
    scales, mins = scales.reshape(nb, N_GROUPS), mins.reshape(nb, N_GROUPS)
    ls, d16 = _four_bits(scales, np.maximum(scales.max(axis=1), F32(0)))
    lm, dmin16 = _four_bits(mins, np.maximum(mins.max(axis=1), F32(0)))
    # C stores the int in a byte, then ORs the min's nibble into it: both wrap to 8 bits
    scale_bytes = ((ls | lm << 4) & 255).astype(np.uint8)
    d = fp16_value(d16) * (scale_bytes & 15).astype(F32)
    dm = fp16_value(dmin16) * (scale_bytes >> 4).astype(F32)
    blocks = x.reshape(nb, N_GROUPS, GROUP)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        requant = np.clip(nearest_int((blocks + dm[..., None]) / d[..., None]), 0, F32(NMAX))
    codes = np.where((d != 0)[..., None], requant, first.T.reshape(blocks.shape))
    qs = pack_2bit(codes.astype(np.uint8).reshape(nb, QK_K))
    out = np.concatenate([scale_bytes, qs, d16, dmin16], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TYPE_SIZE)


def unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group scales ``d * sc`` and offsets ``dmin * m`` ``(nb, 16)`` float32, and codes
    ``(nb, 256)`` uint8 0..3, of Q2_K bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    sc = blocks[:, :16]
    d, dmin = fp16_value(blocks[:, 80:82]), fp16_value(blocks[:, 82:84])
    codes = unpack_2bit(blocks[:, 16:80])
    return d * (sc & 15).astype(F32), dmin * (sc >> 4).astype(F32), codes


def dequantize(b: np.ndarray) -> np.ndarray:
    return dequantize_with_mins(b, unpack, GROUP, TYPE_SIZE)


Q2_K = QuantType("Q2_K", int(GGMLQuantizationType.Q2_K), QK_K, TYPE_SIZE, quantize, dequantize)


def load_torch(backend: Any, raw: Any) -> Any:
    """2-bit codes as uint8 plus one scale ``d * sc`` and one offset ``dmin * m`` per 16."""
    return torch_weight_with_mins(backend, raw, unpack, GROUP)


@hookimpl
def tessera_register_quant_types(register):
    register(Q2_K)


@hookimpl
def tessera_register_weight_kernels(register):
    grouped = torch_grouped_kernel(
        Q2_K, load_torch, "uint8 codes + scale/min per 16, dequantized per matmul"
    )
    register(with_native(Q2_K, grouped))

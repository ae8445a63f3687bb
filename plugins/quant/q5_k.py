"""Q5_K: super-blocks of 256 5-bit codes in 8 groups of 32, bit-exact with llama.cpp.

Block layout (176 bytes): ``d`` and ``dmin`` (float16), the 12 bytes of 6-bit group
scales ``sc`` and mins ``m`` of Q4_K (:mod:`~tessera.plugins.quant.kquant_layout`), 32
bytes ``qh`` and 128 bytes ``qs``. For each 64 values ``64 c + j`` (j < 32) and ``64 c + 32
+ j``, ``qs[32 c + j]`` holds their low 4 bits (low and high nibble); their fifth bits are
bits ``2 c`` and ``2 c + 1`` of ``qh[j]``: value ``v``'s is bit ``v // 32`` of ``qh[v %
32]``. value = ``d * sc * q - dmin * m``.

The quantizer is llama.cpp's reference one without an importance matrix, Q4_K's with 31 as
the largest code (:func:`~tessera.plugins.quant.kquant_fit.quantize_k4`): each group of 32
fitted by ``make_qkx2_quants`` with 16 trial scales ``(30.5 + 0.1 * k) / (max - min)``.
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
    fp16_value,
    torch_grouped_kernel,
    torch_weight_with_mins,
)
from tessera.plugins.quant.kquant_fit import quantize_k4
from tessera.plugins.quant.kquant_layout import unpack_k4_scales
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

TYPE_SIZE = 2 + 2 + 12 + QK_K // 8 + QK_K // 2
GROUP = 32
NMAX = 31
N_GROUPS = QK_K // GROUP
#: Bit ``g`` of ``qh`` belongs to group ``g``.
BIT_OF_GROUP = np.arange(N_GROUPS, dtype=np.uint8)[:, None]


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=F32)
    d16, dmin16, scale_bytes, codes = quantize_k4(x, NMAX, rmin=-0.5, nstep=15)
    groups = codes.reshape(-1, N_GROUPS, GROUP)
    qh = np.bitwise_or.reduce((groups >> 4) << BIT_OF_GROUP, axis=1)
    pairs = (groups & 15).reshape(-1, 4, 2, GROUP)
    qs = (pairs[:, :, 0] | pairs[:, :, 1] << 4).reshape(groups.shape[0], -1)
    out = np.concatenate([d16, dmin16, scale_bytes, qh, qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // QK_K * TYPE_SIZE)


def unpack(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group scales ``d * sc`` and offsets ``dmin * m`` ``(nb, 8)`` float32, and codes
    ``(nb, 256)`` uint8 0..31, of Q5_K bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    nb = blocks.shape[0]
    d, dmin = fp16_value(blocks[:, 0:2]), fp16_value(blocks[:, 2:4])
    sc, m = unpack_k4_scales(blocks[:, 4:16])
    qh = blocks[:, 16:48].reshape(nb, 1, GROUP)
    qs = blocks[:, 48:].reshape(nb, 4, 1, GROUP)
    low = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(nb, N_GROUPS, GROUP)
    codes = low | (qh >> BIT_OF_GROUP & 1) << 4
    return d * sc.astype(F32), dmin * m.astype(F32), codes.reshape(nb, QK_K)


def dequantize(b: np.ndarray) -> np.ndarray:
    return dequantize_with_mins(b, unpack, GROUP, TYPE_SIZE)


Q5_K = QuantType("Q5_K", int(GGMLQuantizationType.Q5_K), QK_K, TYPE_SIZE, quantize, dequantize)


def load_torch(backend: Any, raw: Any) -> Any:
    """5-bit codes as uint8 plus one scale ``d * sc`` and one offset ``dmin * m`` per 32."""
    return torch_weight_with_mins(backend, raw, unpack, GROUP)


@hookimpl
def tessera_register_quant_types(register):
    register(Q5_K)


@hookimpl
def tessera_register_weight_kernels(register):
    grouped = torch_grouped_kernel(
        Q5_K, load_torch, "uint8 codes + scale/min per 32, dequantized per matmul"
    )
    register(with_native(Q5_K, grouped))

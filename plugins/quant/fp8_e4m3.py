"""FP8_E4M3: one OCP FP8 E4M3 byte per value, converted in saturating mode.

Encoding (OCP 8-bit floating point, "E4M3FN"): sign, 4 exponent bits with bias 7, 3
mantissa bits. Exponent field 0 holds subnormals (``m * 2**-9``); S.1111.111 is NaN; there
are no infinities, so the largest finite value is ``1.75 * 2**8 = 448``. Conversion from
float32 rounds to nearest, ties to even, and saturates: every value beyond +-448,
infinities included, becomes +-448. NaN stays NaN (sign kept).

The installed ``gguf`` package (and upstream llama.cpp) has no FP8 tensor type, so this
plugin uses tessera's own ids, :data:`GGML_TYPE_FP8_E4M3` and :data:`FILE_TYPE_FP8_E4M3`
(docs/quant-types.md); llama.cpp cannot read such files.

The torch kernel keeps the weight as ``torch.float8_e4m3fn`` (one byte per weight; the
file's bytes are already that encoding) and converts it to the compute dtype per matmul.
:func:`quantize_torch` is the same conversion with torch: torch's own cast is not
saturating (beyond 464 it gives NaN), so it clamps first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.contract.quant import QuantType, WeightKernel, kernel_matches_reference
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

#: tessera's GGML type id for FP8 E4M3 (not a ggml id; documented in docs/quant-types.md).
GGML_TYPE_FP8_E4M3 = 200
#: tessera's ``general.file_type`` for files made mostly of FP8 E4M3 tensors.
FILE_TYPE_FP8_E4M3 = 200
MAX_FINITE = np.float32(448.0)
NAN_CODE = np.uint8(0x7F)


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    sign = ((x.view(np.uint32) >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    nan = np.isnan(x)
    a = np.minimum(np.abs(np.where(nan, np.float32(0), x)), MAX_FINITE)
    # Normal values: exponent e with a = f * 2**(e+1), f in [0.5, 1); the code counts
    # quanta of 2**(e-4) from binade -6 on. Values below 2**-6 are multiples of 2**-9.
    _, e = np.frexp(a)
    e = np.maximum(e.astype(np.int32) - 1, -6)
    mant = np.rint(np.ldexp(a, 3 - e))  # exact scaling by a power of two, then ties-to-even
    code = np.where(a < 2.0**-6, np.rint(a * np.float32(512)), (e + 6) * 8 + mant)
    code = code.astype(np.uint8) | sign
    return np.where(nan, NAN_CODE | sign, code).astype(np.uint8)


def _decode_table() -> np.ndarray:
    codes = np.arange(256)
    exp, mant = codes >> 3 & 15, codes & 7
    magnitude = np.where(exp == 0, mant * 2.0**-9, (8 + mant) * np.exp2(exp - 10.0))
    values = np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)
    values[0x7F], values[0xFF] = np.nan, -np.nan  # the sign survives a round trip
    return values


DECODE = _decode_table()


def dequantize(b: np.ndarray) -> np.ndarray:
    return DECODE[np.ascontiguousarray(b, dtype=np.uint8)]


FP8_E4M3 = QuantType("FP8_E4M3", GGML_TYPE_FP8_E4M3, 1, 1, quantize, dequantize)


def quantize_torch(x: Any) -> Any:
    """float tensor -> ``torch.float8_e4m3fn``, saturating like :func:`quantize`."""
    import torch

    x = x.float()
    return x.clamp(-float(MAX_FINITE), float(MAX_FINITE)).to(torch.float8_e4m3fn)


class TorchFP8Weight:
    """An FP8 E4M3 weight kept as ``torch.float8_e4m3fn``, converted per matmul."""

    def __init__(self, weight: Any, dtype: Any) -> None:
        self.weight = weight
        self.dtype = dtype
        self.shape = tuple(weight.shape)

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self.weight.to(x.dtype))

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        index = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.weight.device)
        return self.weight[index].to(self.dtype)


def load_torch(backend: Any, raw: Any) -> TorchFP8Weight:
    import torch

    data = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(raw.shape).copy()
    weight = torch.from_numpy(data).view(torch.float8_e4m3fn).to(backend.torch_device)
    return TorchFP8Weight(weight, backend.torch_dtype)


def supports_torch(backend: Any) -> bool:
    """Probe: torch has float8_e4m3fn and one tiny matmul matches numpy; cached.

    Declines on the CPU, where converting per matmul is ~8x slower than the backend's
    fallback of converting once to the compute dtype (bench/quant_types.py).
    """
    if getattr(backend, "name", "") != "torch" or backend.torch_device.type == "cpu":
        return False
    cache = backend.probe_cache
    if "FP8_E4M3" not in cache:
        import torch

        cache["FP8_E4M3"] = hasattr(torch, "float8_e4m3fn") and kernel_matches_reference(
            backend, FP8_E4M3, load_torch
        )
    return cache["FP8_E4M3"]


@hookimpl
def tessera_register_quant_types(register):
    register(FP8_E4M3)


@hookimpl
def tessera_register_weight_kernels(register):
    register(
        WeightKernel(
            backend="torch",
            quant_type="FP8_E4M3",
            supports=supports_torch,
            load=load_torch,
            description="torch.float8_e4m3fn weight, converted per matmul",
        )
    )

"""Plain float storage types F32, F16 and BF16, bit-exact with GGUF (and gguf.quants).

Each stores one value per "block", little-endian. BF16 is the top half of an IEEE float32,
rounded to nearest-even, with NaNs forced to quiet NaNs, exactly as ggml's
``ggml_compute_fp32_to_bf16`` does. A float weight is already in a form every backend
multiplies directly: the backend converts it once to its compute dtype when loading, except
on the torch CPU backend for an F16/BF16 matrix in the compute dtype itself, which the
weight kernel here keeps as a tensor over the file's bytes (no copy, nothing converted at
load; its decode matmuls read those bytes through the native dense GEMV).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType, WeightKernel, file_bytes_tensor
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


def _as_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype="<f4")


def quantize_f32(x: np.ndarray) -> np.ndarray:
    return _as_f32(x).view(np.uint8)


def dequantize_f32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint8).view("<f4")


def quantize_f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype="<f4").astype("<f2").view(np.uint8)


def dequantize_f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint8).view("<f2").astype(np.float32)


def quantize_bf16(x: np.ndarray) -> np.ndarray:
    bits = _as_f32(x).view(np.uint32)
    # A NaN keeps its sign and top mantissa bits and gets the quiet bit (bit 22) set,
    # so rounding can never turn it into an infinity.
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    bits = np.where(is_nan, (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), bits)
    # Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then drop 16
    # bits. After the NaN step no value is close enough to 2**32 to overflow uint32.
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").view(np.uint8)


def dequantize_bf16(b: np.ndarray) -> np.ndarray:
    half = np.ascontiguousarray(b, dtype=np.uint8).view("<u2")
    return (half.astype(np.uint32) << np.uint32(16)).view(np.float32)


F32 = QuantType("F32", int(GGMLQuantizationType.F32), 1, 4, quantize_f32, dequantize_f32)
F16 = QuantType("F16", int(GGMLQuantizationType.F16), 1, 2, quantize_f16, dequantize_f16)
BF16 = QuantType("BF16", int(GGMLQuantizationType.BF16), 1, 2, quantize_bf16, dequantize_bf16)


#: The torch backend's compute dtype that each 16-bit type is stored in already.
IN_PLACE_DTYPES = {"F16": "f16", "BF16": "bf16"}


def in_place_kernel(name: str) -> WeightKernel:
    """The torch kernel of ``name`` (``"F16"`` / ``"BF16"``): a CPU backend computing in that
    very dtype takes a 2-D weight as a view of the memory-mapped file (read-only: ops only
    read weights); any other backend declines and converts the values at load."""

    def supports(backend: Any) -> bool:
        device = getattr(backend, "torch_device", None)
        on_cpu = device is not None and device.type == "cpu"
        return on_cpu and backend.dtype == IN_PLACE_DTYPES[name]

    def load(backend: Any, raw: Any) -> Any:
        rows = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(raw.shape[0], -1)
        return file_bytes_tensor(rows).view(backend.torch_dtype)

    return WeightKernel("torch", name, supports, load, "the file's 16-bit values in place")


@hookimpl
def tessera_register_weight_kernels(register):
    register(in_place_kernel("F16"))
    register(in_place_kernel("BF16"))


@hookimpl
def tessera_register_quant_types(register):
    register(F32)
    register(F16)
    register(BF16)

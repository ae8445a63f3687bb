"""Plain float storage types F32, F16 and BF16, bit-exact with GGUF (and gguf.quants).

Each stores one value per "block", little-endian. BF16 is the top half of an IEEE float32,
rounded to nearest-even, with NaNs forced to quiet NaNs, exactly as ggml's
``ggml_compute_fp32_to_bf16`` does. A float weight is already in a form every backend
multiplies directly: the backend converts it once to its compute dtype when loading. On the
torch CPU backend the weight kernel here takes an F16/BF16 matrix from the file's bytes:
in the compute dtype itself, in a float32 that is the default of a CPU without fast bf16
(not one asked for by name), or F16 in bf16 where the AMX tiles take prefill, as a tensor
over those bytes (no copy, nothing converted at load; its decode matmuls read them through
the native dense GEMV, a float32 prefill widens them per matmul, the AMX tiles round F16
to bf16 block by block), in another dtype converted once (F16 to bf16 by the native
kernels where they pass their self-test, else in torch), without numpy's float32 copy.
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
#: Each 16-bit type's values as torch reads them (the view dtype of the file's bytes).
TORCH_VIEW_DTYPES = {"F16": "float16", "BF16": "bfloat16"}
#: Compute dtypes the file's 16-bit values are converted into in torch (one rounding).
CONVERTED_DTYPES = ("bf16", "f16", "f32")


def in_place_kernel(name: str) -> WeightKernel:
    """The torch kernel of ``name`` (``"F16"`` / ``"BF16"``) on a CPU backend.

    In the very dtype of the file a 2-D weight is a view of the memory-mapped file
    (read-only: ops only read weights). In another float dtype the values are converted
    once in torch straight from the file's bytes, which is what numpy's float32 detour
    gives bit for bit (16-bit to float32 is exact) at a fraction of the start-up time;
    ``TESSERA_DISABLE_KERNELS=F16`` (or ``BF16``) converts through numpy instead. Other
    devices decline and convert the values at load."""

    def supports(backend: Any) -> bool:
        device = getattr(backend, "torch_device", None)
        return device is not None and device.type == "cpu" and backend.dtype in CONVERTED_DTYPES

    def load(backend: Any, raw: Any) -> Any:
        import torch

        rows = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(raw.shape[0], -1)
        values = file_bytes_tensor(rows).view(getattr(torch, TORCH_VIEW_DTYPES[name]))
        from tessera.backends.torch.dense_native import dense_native, f16_in_place, f16_to_bf16

        if backend.dtype == IN_PLACE_DTYPES[name]:
            return values
        default_f32 = backend.dtype == "f32" and not getattr(backend, "exact_f32", True)
        if default_f32 and dense_native(backend) is not None:
            # f32 as a CPU's default: the 16-bit values stay in place too (half the memory and
            # the bytes decode reads), decoded on the native dense GEMV, widened for prefill
            return values
        if name == "F16" and backend.dtype == "bf16":
            # in place where the AMX tiles round each block as they read it, else once here
            return values if f16_in_place(backend) else f16_to_bf16(backend, values)
        return values.to(backend.torch_dtype)

    description = "the file's 16-bit values in place (or converted once in torch)"
    return WeightKernel("torch", name, supports, load, description)


@hookimpl
def tessera_register_weight_kernels(register):
    register(in_place_kernel("F16"))
    register(in_place_kernel("BF16"))


@hookimpl
def tessera_register_quant_types(register):
    register(F32)
    register(F16)
    register(BF16)

"""The F16/BF16 torch kernel on the CPU: a view of the file's bytes in the file's own dtype,
and in any other compute dtype the values numpy's float32 detour gives, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def backend(dtype):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    b.use_kernels(RUNTIME.weight_kernels())
    return b


def raw_weight(kind, shape=(16, 64)):
    """Random values plus the edges a conversion can get wrong: signed zeros, infinities,
    a NaN, float16 subnormals and values halfway between two bf16 neighbours."""
    qt = RUNTIME.quant_type_by_name(kind)
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32) * 3
    values[0, :8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 6e-8, -3e-5, 65504.0]
    values[1, :64] = 1.0 + np.arange(64, dtype=np.float32) * 2.0**-8  # bf16 ties (8 bits kept)
    return RawTensor("blk.0.ffn_up.weight", qt.ggml_type, values.shape, qt.quantize_tensor(values))


@pytest.mark.parametrize("kind", ["F16", "BF16"])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
# a small matrix and one of two million values (odd rows and columns)
@pytest.mark.parametrize("shape", [(16, 64), (1031, 2053)])
# F16 to bf16: the native conversion where the kernels load, and torch's cast
@pytest.mark.parametrize("native_convert", ["on", "off"])
def test_kernel_weight_equals_the_numpy_conversion(kind, dtype, shape, native_convert, monkeypatch):
    monkeypatch.setenv("TESSERA_NATIVE_CONVERT_DISABLE", "1" if native_convert == "off" else "0")
    monkeypatch.setenv("TESSERA_F16_IN_PLACE_DISABLE", "1")  # F16 converted even with AMX
    raw = raw_weight(kind, shape)
    qt = RUNTIME.quant_type_by_name(kind)
    b = backend(dtype)
    w = b.load_weight(raw, qt)
    assert b.placements[-1][1] == f"kernel {kind}"
    want = torch.from_numpy(qt.dequantize_tensor(raw.data, raw.shape)).to(TORCH_DTYPES[dtype])
    assert w.dtype == want.dtype and w.shape == want.shape
    # bit for bit but for NaNs, which stay NaNs (their payload is not kept by either path)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(w), nan)
    bits = torch.int16 if w.element_size() == 2 else torch.int32
    assert torch.equal(w.view(bits)[~nan], want.view(bits)[~nan])
    in_place = {"F16": "f16", "BF16": "bf16"}[kind] == dtype
    assert (w.data_ptr() == raw.data.ctypes.data) == in_place
    if (kind, dtype) == ("F16", "bf16"):
        path = b.paths["F16 weights to bf16"].path
        native = b._native() is not None
        assert path == ("native" if native and native_convert == "on" else "torch")


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_disabling_the_kernel_converts_through_numpy(kind, monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_KERNELS", kind)
    raw = raw_weight(kind)
    qt = RUNTIME.quant_type_by_name(kind)
    b = backend("f32")
    w = b.load_weight(raw, qt)
    assert b.placements[-1][1] == f"dequantize {kind}->f32"
    want = qt.dequantize_tensor(raw.data, raw.shape)
    np.testing.assert_array_equal(w.numpy(), want)


def test_other_devices_decline():
    kernel = RUNTIME.weight_kernels()[("torch", "F16")]
    assert not kernel.supports(RUNTIME.create_backend("numpy"))


@pytest.mark.parametrize("amx", ["on", "off"])
def test_f16_stays_in_place_in_bf16_where_the_amx_tiles_read_it(amx, monkeypatch):
    """An F16 weight on the bf16 backend is the file's bytes where the AMX tiles take its
    prefill (and the dense GEMV its decode), converted once where they do not or the switch
    says so; either way the same values reach the matmuls."""
    monkeypatch.setenv("TESSERA_NATIVE_AMX_DISABLE", "1" if amx == "off" else "0")
    monkeypatch.setenv("TESSERA_TORCH_F32_PREFILL", "0")  # prefill on bf16 matmuls (or tiles)
    raw = raw_weight("F16", (64, 128))
    qt = RUNTIME.quant_type_by_name("F16")
    b = backend("bf16")
    native = b._native()
    w = b.load_weight(raw, qt)
    kept = native is not None and native.amx
    assert b.paths["F16 weights"].path == ("in place" if kept else "converted to bf16")
    assert (w.dtype == torch.float16 and w.data_ptr() == raw.data.ctypes.data) == kept
    monkeypatch.setenv("TESSERA_F16_IN_PLACE_DISABLE", "1")
    converted_backend = backend("bf16")
    converted = converted_backend.load_weight(raw, qt)
    assert converted.dtype == torch.bfloat16
    assert converted_backend.paths["F16 weights"].reason.startswith("disabled by")
    # the matmuls on finite values (the edge values' infinities would make NaN sums)
    values = np.nan_to_num(qt.dequantize_tensor(raw.data, raw.shape), posinf=0, neginf=0)
    finite = torch.from_numpy(values)
    held = finite.half() if kept else finite.bfloat16()  # what this backend holds
    for rows in (1, 5, 16, 40):  # the dense GEMV below 8 rows, the tiles from 16
        x = np.random.default_rng(rows).standard_normal((rows, 128)).astype(np.float32)
        x = torch.from_numpy(x)
        got, want = b.matmul(x, held), converted_backend.matmul(x, finite.bfloat16())
        assert got.dtype == want.dtype == torch.float32
        if rows >= 16 or not kept:  # the same bf16 values on the same kernel
            assert torch.equal(got, want)
        else:  # the GEMV reads the exact float16 values: closer to float64 than bf16's
            exact = x.double() @ finite.double().T
            assert (got.double() - exact).abs().max() <= (want.double() - exact).abs().max()
    rows = b.get_rows(held, np.array([3, 0]))
    assert rows.dtype == b.act_dtype and torch.equal(rows, held[[3, 0]].to(b.act_dtype))

"""16-bit dense weights on the float32 prefill path of the bf16 backend: where it is chosen,
and that its matmuls are float32 products of the exact weights (x unrounded)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tessera.backends.torch import dense_native
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


def _backend(dtype: str = "bf16"):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    b.use_kernels(RUNTIME.weight_kernels())
    return b


def _weight(b, kind: str, shape: tuple[int, int], seed: int):
    qt = RUNTIME.quant_type_by_name(kind)
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    raw = RawTensor(f"blk.0.w{seed}.weight", qt.ggml_type, shape, qt.quantize_tensor(values))
    exact = torch.from_numpy(qt.dequantize_tensor(raw.data, raw.shape))  # the file's values
    return b.load_weight(raw, qt), exact


@pytest.mark.parametrize(
    "flags, vendor, cap, want",
    [
        ({"amx_bf16", "avx512_bf16"}, "GenuineIntel", "", False),  # oneDNN on AMX
        ({"amx_bf16", "avx512_bf16"}, "GenuineIntel", "AVX512_CORE_AMX", False),
        ({"amx_bf16", "avx512_bf16"}, "GenuineIntel", "AVX512_CORE_BF16", True),  # AMX capped
        ({"avx512_bf16"}, "GenuineIntel", "", True),  # Cooper Lake
        ({"avx512_bf16"}, "AuthenticAMD", "", False),  # Zen 4/5: bf16 at twice float32
        ({"avx2", "fma"}, "AuthenticAMD", "", True),  # bf16 emulated
    ],
)
def test_float32_is_chosen_where_bf16_matmuls_are_slower(monkeypatch, flags, vendor, cap, want):
    monkeypatch.setattr(dense_native, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(dense_native, "dense_native", lambda b: SimpleNamespace(amx=False))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert dense_native._float32_is_faster(_backend(), flags)[0] is want


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_the_native_amx_tiles_keep_bf16(monkeypatch, vendor):
    """Where the native tiles take prefill, bf16 stays whatever oneDNN and the CPU say (the
    kernels stand in for this machine's, which may lack AMX)."""
    monkeypatch.setattr(dense_native, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(dense_native, "dense_native", lambda b: SimpleNamespace(amx=True))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # oneDNN without AMX
    for flags in ({"amx_bf16", "avx512_bf16"}, {"avx512_bf16"}):
        assert dense_native._float32_is_faster(_backend(), flags) == (
            False,
            "the native AMX tiles take prefill",
        )


@pytest.mark.parametrize("forced", ["0", "1"])
def test_the_switch_forces_the_path_and_it_is_recorded(monkeypatch, forced):
    monkeypatch.setenv("TESSERA_TORCH_F32_PREFILL", forced)
    b = _backend()
    assert dense_native.f32_prefill(b) is (forced == "1")
    path = b.paths["16-bit prefill"]
    assert path == ("float32" if forced == "1" else "bf16", f"TESSERA_TORCH_F32_PREFILL={forced}")
    f32 = _backend("f32")  # one compute dtype throughout: nothing to choose, nothing recorded
    assert not dense_native.f32_prefill(f32) and "16-bit prefill" not in f32.paths


@pytest.mark.parametrize("kind", ["F16", "BF16"])
@pytest.mark.parametrize("amx", ["0", "1"])  # forced, the path also keeps them off the tiles
def test_prefill_matmuls_are_float32_products_of_the_exact_weights(monkeypatch, kind, amx):
    monkeypatch.setenv("TESSERA_NATIVE_AMX_DISABLE", amx)
    monkeypatch.setenv("TESSERA_TORCH_F32_PREFILL", "1")
    b = _backend()
    (w, w_exact), (u, _) = (_weight(b, kind, (48, 96), seed) for seed in (1, 2))
    if kind == "F16":
        kept = b.paths["F16 weights"].path == "in place"
        assert kept == (b._native() is not None)  # the dense GEMV serves decode
        assert (w.dtype == torch.float16) == kept
    monkeypatch.setenv("TESSERA_TORCH_F32_PREFILL", "0")
    rounded = _backend()
    w16, _ = _weight(rounded, kind, (48, 96), 1)
    for rows in (16, 40):  # prefill rows (decode's below 8 are the dense GEMV's)
        x = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 96)))
        x = x.to(torch.float32)
        exact = x.double() @ w_exact.double().T
        got = b.matmul(x, w)
        assert got.dtype == torch.float32
        if kind == "BF16" or b.paths["F16 weights"].path == "in place":
            assert torch.equal(got, F.linear(x, w_exact))  # the file's values, x unrounded
        bf16_error = (rounded.matmul(x, w16).double() - exact).abs().max()
        assert (got.double() - exact).abs().max() < bf16_error / 8
        q, k = b.matmul_n(x, [w, u])
        assert torch.equal(q, got) and torch.equal(k, b.matmul(x, u))
        swiglu = b.gate_up_swiglu(x, w, u)
        assert swiglu.dtype == torch.float32
        torch.testing.assert_close(swiglu, F.silu(got) * k, rtol=1e-6, atol=1e-6)

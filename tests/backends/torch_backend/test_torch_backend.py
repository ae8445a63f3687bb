"""Torch-specific behaviour: dtype/device choice, weight kernels with probe and fallback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from tessera.backends.torch import backend as torch_backend
from tessera.contract.quant import WeightKernel
from tessera.errors import UnknownBackendError
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


def make_backend(dtype="f32", kernels=True):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    if kernels:
        b.use_kernels(RUNTIME.weight_kernels())
    return b


def quantized(name, shape=(40, 96), seed=0):
    qt = RUNTIME.quant_type_by_name(name)
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    raw = RawTensor("blk.0.ffn_up.weight", qt.ggml_type, shape, qt.quantize_tensor(values))
    return raw, qt, qt.dequantize_tensor(raw.data, shape)


# -- dtype and device ------------------------------------------------------------------


def test_cpu_fast_bf16_is_read_from_cpu_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    with_amx = tmp_path / "amx"
    with_amx.write_text("processor : 0\nflags : fpu sse2 avx2 amx_bf16 amx_tile\n")
    without = tmp_path / "plain"
    without.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f\n")
    assert torch_backend.cpu_has_fast_bf16(with_amx)
    assert not torch_backend.cpu_has_fast_bf16(without)
    assert not torch_backend.cpu_has_fast_bf16(tmp_path / "missing")


def test_default_dtype_follows_the_cpu(monkeypatch):
    monkeypatch.delenv("TESSERA_TORCH_DTYPE", raising=False)
    for fast, expected in ((True, "bf16"), (False, "f32")):
        monkeypatch.setattr(torch_backend, "cpu_has_fast_bf16", lambda fast=fast: fast)
        backend = RUNTIME.create_backend("torch", device="cpu")
        assert backend.dtype == expected
        assert backend.zeros((2,)).dtype == {"bf16": torch.bfloat16, "f32": torch.float32}[expected]


def test_env_overrides_the_automatic_dtype_but_not_an_explicit_one(monkeypatch):
    monkeypatch.setenv("TESSERA_TORCH_DTYPE", "float16")
    assert RUNTIME.create_backend("torch", device="cpu").dtype == "f16"
    assert RUNTIME.create_backend("torch", device="cpu", dtype="f32").dtype == "f32"


@pytest.mark.parametrize("device,dtype", [("cpu", "int3"), ("tpu", "f32"), ("cpu:x", None)])
def test_unknown_device_or_dtype_is_a_clear_error(device, dtype):
    with pytest.raises(UnknownBackendError, match="torch backend"):
        RUNTIME.create_backend("torch", device=device, dtype=dtype)


# The refusal can only happen where there is no GPU; with one, cuda is a valid device.
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine with no GPU")
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(UnknownBackendError, match="no CUDA GPU"):
        RUNTIME.create_backend("torch", device="cuda")


def test_entry_point_modules_do_not_import_torch():
    code = (
        "import sys, tessera.backends.torch.backend, tessera.plugins.quant.q4_0, "
        "tessera.plugins.quant.q8_0, tessera.plugins.quant.floats; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- weight kernels: probe, switch, fallback ---------------------------------------------


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("dtype,tol", [("f32", 1e-5), ("bf16", 2e-2)])
def test_kernel_and_dequantize_fallback_agree(name, dtype, tol, monkeypatch):
    raw, qt, dense = quantized(name)
    monkeypatch.delenv("TESSERA_DISABLE_KERNELS", raising=False)
    fast = make_backend(dtype)
    w_fast = fast.load_weight(raw, qt)
    monkeypatch.setenv("TESSERA_DISABLE_KERNELS", name.lower())
    slow = make_backend(dtype)
    w_slow = slow.load_weight(raw, qt)

    assert not isinstance(w_fast, torch.Tensor) and w_fast.shape == raw.shape
    assert isinstance(w_slow, torch.Tensor)
    assert fast.placements == [(raw.name, f"kernel {name}", w_fast_description(name))]
    assert slow.placements[0][1] == f"dequantize {name}->{dtype}"
    assert "TESSERA_DISABLE_KERNELS" in slow.placements[0][2]

    x = np.random.default_rng(1).standard_normal((33, raw.shape[1])).astype(np.float32)
    for rows in (1, 5, 33):  # decode, small batch, and the prefill path of Q4_0
        want = x[:rows] @ dense.T
        for b, w in ((fast, w_fast), (slow, w_slow)):
            got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
            assert np.abs(got - want).max() <= tol * np.abs(want).max()
    ids = np.array([39, 0, 7, 7])
    for b, w in ((fast, w_fast), (slow, w_slow)):
        rows = b.to_numpy(b.get_rows(w, ids))
        assert np.abs(rows - dense[ids]).max() <= tol * np.abs(dense).max()


def w_fast_description(name):
    return RUNTIME.weight_kernels()[("torch", name)].description


def test_q4_0_int4_kernel_is_exact_in_f32_and_dense_switch_gives_the_same(monkeypatch):
    raw, qt, dense = quantized("Q4_0", shape=(64, 256), seed=3)
    x = np.random.default_rng(4).standard_normal((20, 256)).astype(np.float32)
    results = {}
    for setting in ("inf", "1"):  # int4 kernel for every size / dequantize for every size
        monkeypatch.setenv("TESSERA_Q4_0_DENSE_ROWS", setting)
        b = make_backend("f32")
        results[setting] = b.to_numpy(b.matmul(b.from_numpy(x), b.load_weight(raw, qt)))
    want = x @ dense.T
    for got in results.values():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_disable_all_kernels(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_KERNELS", "all")
    b = make_backend()
    for name in ("Q4_0", "Q8_0"):
        raw, qt, _ = quantized(name)
        assert isinstance(b.load_weight(raw, qt), torch.Tensor)
    assert all(p[1].startswith("dequantize") for p in b.placements)


def test_a_declining_probe_falls_back_and_is_recorded(monkeypatch):
    monkeypatch.delenv("TESSERA_DISABLE_KERNELS", raising=False)
    calls = []

    def never(backend):
        calls.append(backend)
        return False

    def must_not_load(backend, raw):
        raise AssertionError("load called although the probe declined")

    raw, qt, dense = quantized("Q8_0")
    b = make_backend(kernels=False)
    b.use_kernels(
        {
            ("torch", "Q8_0"): WeightKernel("torch", "Q8_0", never, must_not_load),
            ("numpy", "Q4_0"): WeightKernel("numpy", "Q4_0", never, must_not_load),
        }
    )
    w = b.load_weight(raw, qt)
    np.testing.assert_allclose(b.to_numpy(w), dense, rtol=1e-6)
    assert calls == [b]
    assert "declined by its probe" in b.placements[0][2]


def test_without_kernels_quantized_weights_are_dequantized():
    raw, qt, dense = quantized("Q4_0")
    b = make_backend(kernels=False)
    np.testing.assert_array_equal(b.to_numpy(b.load_weight(raw, qt)), dense)
    assert b.placements == [(raw.name, "dequantize Q4_0->f32", "no torch kernel for Q4_0")]


def test_real_probes_run_once_and_are_cached_on_the_backend():
    b = make_backend()
    kernels = RUNTIME.weight_kernels()
    assert kernels[("torch", "Q4_0")].supports(b) is True
    # "native": the native decode kernels' probe, run by the Q4_0 kernel's loader
    assert {k: v for k, v in b.probe_cache.items() if k != "native"} == {"Q4_0": True}
    b.probe_cache["Q4_0"] = False  # a cached answer is not asked again
    assert kernels[("torch", "Q4_0")].supports(b) is False
    numpy_backend = RUNTIME.create_backend("numpy")
    assert not kernels[("torch", "Q8_0")].supports(numpy_backend)


@pytest.mark.parametrize("f32_acts, held", [("0", "bf16"), ("1", "f32")])
def test_1d_float_weights_become_plain_tensors_in_the_activation_dtype(f32_acts, held, monkeypatch):
    """Norm weights and biases: in the compute dtype, or in float32 beside float32
    activations (bf16 on the CPU), the file's values unrounded."""
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", f32_acts)
    b = make_backend("bf16")
    qt = RUNTIME.quant_type_by_name("F16")
    norm = np.linspace(-1, 1, 64, dtype=np.float32)
    raw = RawTensor("output_norm.weight", qt.ggml_type, (64,), qt.quantize_tensor(norm))
    w = b.load_weight(raw, qt)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[held]
    assert isinstance(w, torch.Tensor) and w.dtype == dtype and w.shape == (64,)
    assert b.placements[0][:2] == ("output_norm.weight", f"dequantize F16->{held}")
    want = torch.from_numpy(qt.dequantize_tensor(qt.quantize_tensor(norm), (64,))).to(dtype)
    assert torch.equal(w, want)


# -- inference mode -------------------------------------------------------------------------


def test_ops_work_inside_and_outside_inference_mode():
    b = make_backend()
    with torch.inference_mode():
        cache = b.zeros((8, 2, 4))
    src = b.from_numpy(np.ones((2, 2, 4), np.float32))
    b.set_rows(cache, np.array([1, 6]), src)  # an inference tensor written outside the mode
    got = b.to_numpy(cache)
    assert got[[1, 6]].min() == 1.0 and np.delete(got, [1, 6], axis=0).max() == 0.0
    with torch.inference_mode():
        q = b.from_numpy(np.ones((1, 2, 4), np.float32))
        out = b.attention(q, cache, cache, 8, np.ones((1, 8), bool), 0.5)
    # two cells score 4 * 0.5 = 2 and six score 0; the value is the weight of the two
    e2 = np.exp(2.0)
    np.testing.assert_allclose(b.to_numpy(out), 2 * e2 / (2 * e2 + 6), rtol=1e-6)

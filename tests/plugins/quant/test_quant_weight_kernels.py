"""The torch weight kernels of Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K: integer codes plus
per-group scales (and offsets) that multiply as their dequantized weight does; Q4_1 on
torch's int4 kernel for CPU decode in bf16 (``TESSERA_Q4_1_INT4_ROWS``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

NAMES = ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]
RUNTIME = Runtime()


def backend(dtype):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    b.use_kernels(RUNTIME.weight_kernels())
    return b


def weight(name, n_out=24, n_in=512, seed=0):
    qt = RUNTIME.quant_type_by_name(name)
    values = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    values[0] = 0.0  # all-zero blocks: scale 0
    values[1] = np.abs(values[1])  # min > 0
    values[2] *= np.float32(1e-3)
    data = qt.quantize_tensor(values)
    raw = RawTensor("w", qt.ggml_type, values.shape, data)
    return raw, qt, qt.dequantize_tensor(data, values.shape)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_multiplies_as_the_dequantized_weight(name):
    b = backend("f32")
    kernel = RUNTIME.weight_kernels()[("torch", name)]
    # on the CPU in float32 a weight dequantized once multiplies faster: the probe declines
    assert not kernel.supports(b)
    raw, qt, dense = weight(name)
    w = kernel.load(b, raw)
    assert w.shape == raw.shape
    x = np.random.default_rng(1).standard_normal((3, raw.shape[1])).astype(np.float32)
    got = b.to_numpy(w.matmul(b.from_numpy(x)))
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-4)
    ids = np.array([2, 0, 5, 5])
    np.testing.assert_array_equal(b.to_numpy(w.get_rows(ids)), dense[ids])


@pytest.mark.parametrize("name", NAMES)
def test_probe_in_bf16_on_the_cpu_accepts_only_the_int4_path(name, monkeypatch):
    # Q4_1 decodes on torch's int4 kernel; the others multiply faster dequantized once
    monkeypatch.setenv("TESSERA_NATIVE_QUANT_DISABLE", "all")  # native: tests/backends/native
    assert RUNTIME.weight_kernels()[("torch", name)].supports(backend("bf16")) == (name == "Q4_1")


def test_q4_1_int4_path_matches_numpy_in_f32_when_forced(monkeypatch):
    monkeypatch.setenv("TESSERA_Q4_1_INT4_ROWS", "inf")
    raw, qt, dense = weight("Q4_1", seed=2)
    b = backend("f32")
    w = b.load_weight(raw, qt)
    assert b.placements[0][1] == "kernel Q4_1" and w.dense_min_rows == np.inf
    x = np.random.default_rng(3).standard_normal((3, raw.shape[1])).astype(np.float32)
    want = x @ dense.T
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_array_equal(b.to_numpy(b.get_rows(w, np.array([3, 0]))), dense[[3, 0]])


def test_q4_1_bf16_decode_and_prefill_paths_and_the_off_switch(monkeypatch):
    monkeypatch.delenv("TESSERA_Q4_1_INT4_ROWS", raising=False)
    monkeypatch.setenv("TESSERA_NATIVE_QUANT_DISABLE", "Q4_1")  # native: tests/backends/native
    raw, qt, dense = weight("Q4_1", seed=4)
    b = backend("bf16")
    w = b.load_weight(raw, qt)
    assert b.placements[0][1] == "kernel Q4_1" and w.dense_min_rows == 16
    x = np.random.default_rng(5).standard_normal((300, raw.shape[1])).astype(np.float32)
    for rows in (1, 300):  # int4 kernel / the dense copy
        want = x[:rows] @ dense.T
        got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    monkeypatch.setenv("TESSERA_Q4_1_INT4_ROWS", "0")
    assert isinstance(backend("bf16").load_weight(raw, qt), torch.Tensor)  # dequantized

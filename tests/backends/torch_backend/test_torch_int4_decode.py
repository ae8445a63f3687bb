"""Decode matmuls on the torch int4 kernel: Q8_0 as two int4 halves (exact split) and Q4_K
(scale and min per 32 as int4 scale and zero); switches, and every path vs numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime
from tessera.plugins.quant import q8_0 as quant_q8_0

RUNTIME = Runtime()
Q8_0 = RUNTIME.quant_type_by_name("Q8_0")


def backend(dtype):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    b.use_kernels(RUNTIME.weight_kernels())
    return b


def q8_0_weight(n_out=40, n_in=128, seed=0):
    """A Q8_0 tensor whose codes span the whole int8 range, -128 included (ggml's quantizer
    never writes -128, but a file may hold it)."""
    raw = Q8_0.quantize_tensor(
        np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    )
    blocks = raw.reshape(n_out, -1, quant_q8_0.TYPE_SIZE).copy()
    codes = blocks[..., 2:].view(np.int8)
    codes[: 256 // n_in] = np.arange(-128, 128, dtype=np.int8).reshape(-1, *codes.shape[1:])
    assert codes.min() == -128 and codes.max() == 127
    data = blocks.reshape(n_out, -1)
    return RawTensor("w", Q8_0.ggml_type, (n_out, n_in), data), Q8_0.dequantize_tensor(
        data, (n_out, n_in)
    )


def test_split_int4_reconstructs_every_code_exactly():
    q = np.arange(-128, 128, dtype=np.int8).reshape(8, 32)
    d = np.array([[0.5], [1.0], [2.0], [3.0], [0.25], [7.0], [0.125], [1.5]], np.float32)
    (h, s_hi, z_hi), (lo, s_lo, z_lo) = quant_q8_0.split_int4(q, d)
    assert h.max() <= 15 and lo.max() <= 15
    value = lambda c, s, z: (c.astype(np.float32) - 8) * np.repeat(s, 32, 1) + np.repeat(z, 32, 1)  # noqa: E731
    np.testing.assert_array_equal(
        value(h, s_hi, z_hi) + value(lo, s_lo, z_lo), q.astype(np.float32) * np.repeat(d, 32, 1)
    )


@pytest.mark.parametrize("setting", ["inf", "0"])
def test_both_paths_match_numpy_in_f32(setting, monkeypatch):
    # inf: the int4 pair for every matmul; 0: the switch that always dequantizes
    monkeypatch.setenv("TESSERA_Q8_0_DENSE_ROWS", setting)
    raw, dense = q8_0_weight()
    b = backend("f32")
    w = b.load_weight(raw, Q8_0)
    assert (w.int4 is not None) == (setting == "inf")
    x = np.random.default_rng(1).standard_normal((5, raw.shape[1])).astype(np.float32)
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-4)
    ids = np.array([39, 0, 7, 7])
    np.testing.assert_array_equal(b.to_numpy(b.get_rows(w, ids)), dense[ids])


def test_bf16_decode_uses_the_pair_and_prefill_dequantizes(monkeypatch):
    monkeypatch.delenv("TESSERA_Q8_0_DENSE_ROWS", raising=False)
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")  # native: test_native_kernels.py
    raw, dense = q8_0_weight(n_out=24, n_in=64, seed=2)
    b = backend("bf16")
    w = b.load_weight(raw, Q8_0)
    assert w.int4 is not None and w.dense_min_rows == quant_q8_0.DEFAULT_DENSE_MIN_ROWS
    x = np.random.default_rng(3).standard_normal((300, 64)).astype(np.float32)
    for rows in (1, 300):  # decode (int4 pair) and prefill (dequantized bf16 matmul)
        got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
        want = x[:rows] @ dense.T
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_f32_on_cpu_dequantizes_by_default(monkeypatch):
    # torch's CPU int4 kernel is far slower in float32 than a dequantized matmul
    monkeypatch.delenv("TESSERA_Q8_0_DENSE_ROWS", raising=False)
    raw, _ = q8_0_weight()
    assert backend("f32").load_weight(raw, Q8_0).int4 is None


Q4_K = RUNTIME.quant_type_by_name("Q4_K")


def q4_k_weight(n_out=24, n_in=512, seed=5):
    values = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    data = Q4_K.quantize_tensor(values)
    return RawTensor("w", Q4_K.ggml_type, (n_out, n_in), data), Q4_K.dequantize_tensor(
        data, (n_out, n_in)
    )


def test_q4_k_int4_path_matches_numpy_in_f32_when_forced(monkeypatch):
    monkeypatch.setenv("TESSERA_Q4_K_INT4_ROWS", "inf")
    raw, dense = q4_k_weight()
    b = backend("f32")
    w = b.load_weight(raw, Q4_K)
    assert b.placements[0][1] == "kernel Q4_K" and w.dense_min_rows == np.inf
    x = np.random.default_rng(6).standard_normal((3, raw.shape[1])).astype(np.float32)
    want = x @ dense.T
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    np.testing.assert_allclose(b.to_numpy(b.get_rows(w, np.array([3, 0]))), dense[[3, 0]])


def test_q4_k_bf16_decode_and_prefill_paths_and_the_off_switch(monkeypatch):
    monkeypatch.delenv("TESSERA_Q4_K_INT4_ROWS", raising=False)
    monkeypatch.setenv("TESSERA_NATIVE_QUANT_DISABLE", "Q4_K")  # native: test_native_block_types.py
    raw, dense = q4_k_weight()
    b = backend("bf16")
    w = b.load_weight(raw, Q4_K)
    assert b.placements[0][1] == "kernel Q4_K" and w.dense_min_rows == 16
    x = np.random.default_rng(7).standard_normal((300, raw.shape[1])).astype(np.float32)
    for rows in (1, 300):  # int4 kernel / the dense copy
        want = x[:rows] @ dense.T
        got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    monkeypatch.setenv("TESSERA_Q4_K_INT4_ROWS", "0")
    off = backend("bf16")
    off.load_weight(raw, Q4_K)
    assert off.placements[0][1] == "dequantize Q4_K->bf16"
    f32 = backend("f32")
    monkeypatch.delenv("TESSERA_Q4_K_INT4_ROWS")
    f32.load_weight(raw, Q4_K)  # float32 on the CPU: dequantized once at load too
    assert f32.placements[0][1] == "dequantize Q4_K->f32"

"""The AMX tile matmuls with float32 outputs (:mod:`tessera.backends.native.amx_f32`), which
serve float32 activations: against numpy float64 over the same bf16 values within float32
sums (no bf16 rounding of the output), and the bf16-output kernel's values once rounded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_native_kernels import backend, tiles_reference, weight_bytes

from tessera.backends.native.amx_f32 import tiles_f32


@pytest.fixture(scope="module")
def tiles():
    """The native kernels where the AMX tiles run (test_native_kernels.py fails a CPU with
    AMX whose tiles are off; here that case is its skip)."""
    native = backend()._native()
    if native is None or not native.amx:
        # Real skip: the tile kernels exist only on CPUs with AMX (not on Zen 4 or AVX2
        # laptops), where the int8 GEMM's and the plain paths' tests cover prefill
        pytest.skip("no AMX tiles on this CPU")
    return native


def weight(name, n_out, n_in, rng):
    """``(weight for the kernel, its values as float64 after the rounding to bf16)``."""
    if name in ("BF16", "F16"):
        w = torch.from_numpy(rng.standard_normal((n_out, n_in)).astype(np.float32))
        w = w.bfloat16() if name == "BF16" else w.half()
        return w, w.bfloat16().double().numpy()
    raw = weight_bytes(name, n_out, n_in, rng)
    return torch.from_numpy(raw), raw


def reference(name, w, values, x):
    if name in ("BF16", "F16"):
        xs = x.double().numpy()
        return xs @ values.T, np.abs(xs) @ np.abs(values).T
    return tiles_reference(name, values, x)


@pytest.mark.parametrize("name", ["BF16", "F16", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out, n_in, rows", [(32, 32, 16), (64, 96, 33), (160, 896, 70)])
def test_float32_tiles_match_numpy_without_rounding(
    tiles, name, threads, n_out, n_in, rows, monkeypatch
):
    monkeypatch.setattr(tiles, "_threads", lambda: threads)
    rng = np.random.default_rng(n_out + n_in + rows)
    w, values = weight(name, n_out, n_in, rng)
    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32) * 3).bfloat16()
    got = tiles_f32(tiles, name, (w,), x)
    assert got.dtype == torch.float32 and got.shape == (rows, n_out)
    want, exact = reference(name, w, values, x)
    err = np.abs(got.double().numpy() - want)
    assert np.all(err <= 1e-5 * exact + 1e-30), err.max()  # float32 sums only
    assert (got != got.bfloat16().float()).float().mean() > 0.9  # not rounded to bf16
    if name != "BF16":  # the bf16 kernel's output is this one rounded to bf16 (F16 included)
        assert torch.equal(tiles.matmul_tiles(name, w, x), got.bfloat16())


@pytest.mark.parametrize("name", ["BF16", "F16", "Q8_0"])
def test_float32_swiglu_tiles_match_numpy(tiles, name):
    rng = np.random.default_rng(7)
    (wg, vg), (wu, vu) = (weight(name, 48, 96, rng) for _ in range(2))
    x = torch.from_numpy(rng.standard_normal((33, 96)).astype(np.float32)).bfloat16()
    got = tiles_f32(tiles, name, (wg, wu), x)
    (g, exact_g), (u, exact_u) = (reference(name, *wv, x) for wv in ((wg, vg), (wu, vu)))
    want = g / (1 + np.exp(-g)) * u
    # float32 sums move g and u by 1e-5 of sum |x||w|; silu' <= 1.1; exp to ~1e-7
    sums = 1e-5 * (1.1 * exact_g * (np.abs(u) + exact_u) + (np.abs(g) + exact_g) * exact_u)
    err = np.abs(got.double().numpy() - want)
    assert np.all(err <= sums + 1e-6 * np.abs(want) + 1e-30), err.max()


def test_float32_tiles_take_only_what_they_serve(tiles):
    x = torch.randn(20, 64).bfloat16()
    w = torch.randn(48, 64).bfloat16()  # 48 rows: not a multiple of 32
    assert tiles_f32(tiles, "BF16", (w,), x) is None
    w = torch.randn(64, 64)
    assert tiles_f32(tiles, "BF16", (w,), x) is None  # float32 weights: not a BF16 tensor
    assert tiles_f32(tiles, "BF16", (w.bfloat16(),), x[:15]) is None  # too few rows
    assert tiles_f32(tiles, "F16", (w.bfloat16(),), x) is None  # not an F16 tensor
    assert tiles_f32(tiles, "Q5_0", (w.half(),), x) is None  # a kind the tiles do not read


def test_float32_activations_take_the_float32_tiles_from_16_rows(tiles, monkeypatch):
    """The torch backend's matmul and gate_up_swiglu on BF16 weights: the float32 tiles from
    16 rows (float32 out; the SwiGLU's product, the down projection's bf16 input, in bf16),
    the native GEMV below; against numpy over the same inputs."""
    import tessera.backends.torch.weights as torch_weights

    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "1")
    b = backend()
    calls = []
    real = torch_weights.tiles_f32
    monkeypatch.setattr(
        torch_weights, "tiles_f32", lambda *a, **k: calls.append(a[3].shape[0]) or real(*a, **k)
    )
    rng = np.random.default_rng(9)
    w, values = weight("BF16", 64, 128, rng)
    for rows in (5, 16, 40):
        x = torch.from_numpy(rng.standard_normal((rows, 128)).astype(np.float32))
        y = b.matmul(x, w)
        assert y.dtype == torch.float32
        # the tiles round x to bf16 and sum in float32; the GEMV may keep x in float32
        tiled = rows >= 16
        want, exact = reference("BF16", w, values, x.bfloat16() if tiled else x.double())
        err = np.abs(y.double().numpy() - want)
        assert np.all(err <= (1e-5 if tiled else 2.0**-8) * exact + 1e-30)
        act = b.gate_up_swiglu(x, w, w)
        assert act.dtype == (torch.bfloat16 if rows >= 16 else torch.float32)
    assert calls == [16, 16, 40, 40]

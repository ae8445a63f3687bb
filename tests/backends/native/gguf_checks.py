"""What the native kernel tests share: the check of the block kernels against gguf's
dequantization (each type family's test file builds its own random and edge blocks), the
kernels' int8 rounding of activations, and running a call at a torch thread count."""

import functools

import numpy as np
import torch

from tessera.backends.native import selftest


def with_threads(n, fn):
    """``fn()`` with torch (and so the native kernels' OpenMP) at ``n`` threads."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(saved)


def int8_activations(x):
    """x rounded as the kernels do (blocks of 32, float32 steps, round half to even), as
    float64."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    d = (amax / np.float32(127)).astype(np.float32)
    return (np.rint(blocks * inv).astype(np.float64) * d).reshape(x.shape)


def check_against_gguf(lib, kind, raw, rows=3, seed=0):
    """GEMV within the int8-activation bound of x @ dense.T (float32 and bf16 activations,
    1-2 threads) and the dequantization bit for bit, dense = gguf's dequantization."""
    dense = selftest._GgufOracle(kind).dequantize(raw)
    assert np.all(np.isfinite(dense))
    rng = np.random.default_rng(seed)
    for dtype, rounding in ((torch.float32, 0.0), (torch.bfloat16, 2.0**-8)):
        x = torch.from_numpy(rng.standard_normal((rows, dense.shape[1])).astype(np.float32))
        x = x.to(dtype)
        x[0, :32] = 0  # an all-zero activation block (scale 0)
        xs = x.float().numpy()
        want = xs.astype(np.float64) @ dense.astype(np.float64).T
        bound = selftest.error_bound(dense, xs) + rounding * np.abs(want)
        w = torch.from_numpy(raw)
        for threads in (1, 2):
            got = with_threads(threads, functools.partial(lib.matmul, kind, w, x))
            got = got.float().numpy()
            assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = lib.dequantize(kind, torch.from_numpy(raw), dtype)
        assert torch.equal(got, torch.from_numpy(dense).to(dtype))

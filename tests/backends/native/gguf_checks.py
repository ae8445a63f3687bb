"""The native block kernels against gguf's dequantization: the check the block-type tests
share (each type family's test file builds its own random and edge blocks)."""

import numpy as np
import torch

from tessera.backends.native import selftest


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
        for threads in (1, 2):
            saved = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                got = lib.matmul(kind, torch.from_numpy(raw), x).float().numpy()
            finally:
                torch.set_num_threads(saved)
            assert got.shape == want.shape and np.all(np.abs(got - want) <= bound)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = lib.dequantize(kind, torch.from_numpy(raw), dtype)
        assert torch.equal(got, torch.from_numpy(dense).to(dtype))

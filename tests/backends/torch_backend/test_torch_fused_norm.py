"""The torch backend's fused RMSNorm: probe, switch, and both paths against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


@pytest.mark.parametrize("dtype,tol", [("f32", 1e-6), ("bf16", 1e-2)])
@pytest.mark.parametrize("switch", ["", "0"])
def test_rms_norm_paths_match_numpy(dtype, tol, switch, monkeypatch):
    monkeypatch.setenv("TESSERA_TORCH_FUSED_NORM", switch)
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")  # the torch paths (native: its own test)
    torch_b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    numpy_b = RUNTIME.create_backend("numpy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 896)).astype(np.float32) * 3
    w = rng.uniform(0.5, 1.5, 896).astype(np.float32)
    got = torch_b.to_numpy(torch_b.rms_norm(torch_b.from_numpy(x), torch_b.from_numpy(w), 1e-6))
    # the reference sees the inputs as the backend holds them (rounded to its dtype)
    xr, wr = (torch_b.to_numpy(torch_b.from_numpy(a)) for a in (x, w))
    want = numpy_b.rms_norm(xr, wr, 1e-6)
    assert torch_b._fused_norm is (switch != "0")
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    no_weight = torch_b.to_numpy(torch_b.rms_norm(torch_b.from_numpy(x), None, 1e-6))
    np.testing.assert_allclose(no_weight, numpy_b.rms_norm(xr, None, 1e-6), rtol=tol, atol=tol)

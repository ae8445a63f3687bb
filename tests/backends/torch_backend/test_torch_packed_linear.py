"""The torch backend's packed ``linear`` (oneDNN weights reordered once) and its forward
scope (``torch.inference_mode``): probes, switches, and both paths against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.contract.ops import op
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


def _torch(dtype, monkeypatch, packed):
    monkeypatch.setenv("TESSERA_TORCH_PACKED_LINEAR", "" if packed else "0")
    return RUNTIME.create_backend("torch", device="cpu", dtype=dtype)


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((29, 96)).astype(np.float32)
    w = (rng.standard_normal((160, 96)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(160).astype(np.float32)
    residual = rng.standard_normal((29, 160)).astype(np.float32)
    return x, w, bias, residual


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("epilogue", ["", "gelu", "gelu_erf", "residual"])
def test_bf16_linear_paths_match_numpy(packed, epilogue, monkeypatch):
    b = _torch("bf16", monkeypatch, packed)
    ref = RUNTIME.create_backend("numpy")
    x, w, bias, residual = (b.to_numpy(b.from_numpy(a)) for a in _inputs())  # bf16 values
    act = epilogue if epilogue.startswith("gelu") else ""
    res = residual if epilogue == "residual" else None
    tb = [b.from_numpy(a) for a in (x, w, bias)]
    got = b.to_numpy(b.linear(*tb, act, None if res is None else b.from_numpy(res)))
    want = ref.linear(x, w, bias, act, res)
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=3e-2)
    took = b._packed_linear.ok
    assert took is (packed and torch.backends.mkldnn.is_available())
    reason = [p for p in b.placements if p[0] == "linear weights"]
    assert reason == [("linear weights", "packed" if took else "F.linear", b._packed_linear.reason)]
    if not packed:
        assert b._packed_linear.reason == "disabled by TESSERA_TORCH_PACKED_LINEAR=0"


def test_packed_plain_linear_is_bit_identical_to_f_linear(monkeypatch):
    b = _torch("bf16", monkeypatch, True)
    if not b.supports(op("linear")) or not torch.backends.mkldnn.is_available():
        # Real skip: a torch build without oneDNN cannot pack weights (the test above checks
        # that such a build falls back to F.linear); the project's x86 CPU torch has oneDNN.
        pytest.skip("no oneDNN in this torch")
    x, w, bias, _ = (b.from_numpy(a) for a in _inputs(1))
    got = b.linear(x, w, bias)
    assert b._packed_linear.ok and len(b._packed_linear._packed) == 1  # packed once, kept
    assert torch.equal(got, torch.nn.functional.linear(x, w, bias))
    b.linear(x, w, bias)
    assert len(b._packed_linear._packed) == 1


def test_f32_stays_on_f_linear(monkeypatch):
    b = _torch("f32", monkeypatch, True)
    x, w, bias, _ = (b.from_numpy(a) for a in _inputs(2))
    got = b.linear(x, w, bias, "gelu_erf")
    assert not b._packed_linear.ok and "only for bf16/f16" in b._packed_linear.reason
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias))
    assert torch.equal(got, want)


@pytest.mark.parametrize("switch", ["", "0"])
def test_forward_scope_is_inference_mode_unless_switched_off(switch, monkeypatch):
    monkeypatch.setenv("TESSERA_TORCH_INFERENCE_MODE", switch)
    b = RUNTIME.create_backend("torch", device="cpu", dtype="f32")
    x, w, bias, _ = (b.from_numpy(a) for a in _inputs(3))
    outside = b.linear(x, w, bias)
    with b.forward_scope():
        assert torch.is_inference_mode_enabled() is (switch != "0")
        inside = b.linear(x, w, bias)
    assert not torch.is_inference_mode_enabled()
    assert torch.equal(inside, outside)
    # the numpy reference's scope does nothing
    with RUNTIME.create_backend("numpy").forward_scope():
        assert not torch.is_inference_mode_enabled()

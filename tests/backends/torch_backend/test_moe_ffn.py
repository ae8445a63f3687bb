"""The routed-experts op (``moe_ffn``) asks only for the experts the rows selected, once each,
on every backend and on the core-op fallback; results match the reference backend."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.contract.experts import StackedExperts, moe_ffn_fallback
from tessera.contract.ops import op
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
SETTINGS = [("numpy", None), ("torch", "f32"), ("torch", "bf16")]


class Recording(StackedExperts):
    """Stacked experts that remember which ids were asked for."""

    def __init__(self, *stacks):
        super().__init__(*stacks)
        self.asked: list[list[int]] = []

    def get(self, experts):
        self.asked.append([int(e) for e in experts])
        return super().get(experts)


def inputs(backend, n_tokens=9, n_expert=8, k=2, n_embd=32, n_ff=16):
    rng = np.random.default_rng(5)
    ids = np.stack([rng.choice([0, 3, 5, 6], size=k, replace=False) for _ in range(n_tokens)])
    weights = rng.random((n_tokens, k)).astype(np.float32)
    stacks = [
        rng.standard_normal(s).astype(np.float32) * 0.3
        for s in ((n_expert, n_ff, n_embd), (n_expert, n_ff, n_embd), (n_expert, n_embd, n_ff))
    ]
    x = rng.standard_normal((n_tokens, n_embd)).astype(np.float32)
    loaded = [backend.from_numpy(s) for s in stacks]
    return backend.from_numpy(x), ids, weights, loaded, (x, stacks)


def reference(x, ids, weights, stacks):
    gate, up, down = stacks
    out = np.zeros_like(x)
    for t in range(len(x)):
        for e, w in zip(ids[t], weights[t], strict=True):
            g, u = gate[e] @ x[t], up[e] @ x[t]
            out[t] += w * (down[e] @ (g / (1 + np.exp(-g)) * u))
    return out


@pytest.mark.parametrize("path", ["op", "fallback"])
@pytest.mark.parametrize("name,dtype", SETTINGS, ids=lambda s: str(s))
def test_only_selected_experts_are_fetched_once_and_summed(name, dtype, path):
    backend = RUNTIME.create_backend(name, device="cpu", dtype=dtype)
    x, ids, weights, loaded, (x_np, stacks) = inputs(backend)
    experts = Recording(*loaded)
    if path == "op":
        assert backend.supports(op("moe_ffn", n_expert=8, n_expert_used=2))
        out = backend.moe_ffn(x, ids, weights, experts)
    else:
        out = moe_ffn_fallback(backend, x, ids, weights, experts)
    assert experts.asked == [[0, 3, 5, 6]]  # one request, the distinct selected ids only
    want = reference(x_np, ids, weights, stacks)
    tol = 1e-5 if backend.dtype == "f32" else 3e-2
    got = backend.to_numpy(out)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_decode_row_uses_its_two_experts():
    backend = RUNTIME.create_backend("torch", device="cpu", dtype="f32")
    x, ids, weights, loaded, (x_np, stacks) = inputs(backend, n_tokens=1)
    experts = Recording(*loaded)
    out = backend.to_numpy(backend.moe_ffn(x, ids, weights, experts))
    assert experts.asked == [sorted(ids[0].tolist())]
    np.testing.assert_allclose(out, reference(x_np, ids, weights, stacks), atol=1e-5)

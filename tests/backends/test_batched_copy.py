"""Batched transfers (set_n / get_n / copy_n) against the per-tensor defaults, and the
switch that forces the per-tensor path."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.backend import OPTIONAL_OPS, Backend
from tessera.contract.ops import op
from tessera.engine import state as context_state
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


@pytest.fixture(scope="module", params=["numpy", "torch-f32", "torch-bf16"])
def backend(request):
    if request.param == "numpy":
        return NumpyBackend()
    return RUNTIME.create_backend("torch", device="cpu", dtype=request.param.split("-")[1])


def _tensors(backend, rng, n=4):
    """Cache-like tensors of a few shapes with values exact in every dtype."""
    shapes = [(16, 2, 8), (16, 1, 4), (16, 3, 8), (16, 2, 2)][:n]
    return [backend.from_numpy(rng.integers(-8, 8, s).astype(np.float32)) for s in shapes]


ROWS = {
    "all": lambda n: None,
    "run": lambda n: np.arange(3, 9),
    "scattered": lambda n: np.array([7, 1, 12, 4]),
    "empty": lambda n: np.zeros(0, dtype=np.int64),
}


def test_transfers_are_optional_ops():
    assert {"set_n", "get_n", "copy_n"} <= set(OPTIONAL_OPS)
    assert not NumpyBackend().supports(op("set_n"))
    assert RUNTIME.create_backend("torch", device="cpu", dtype="f32").supports(op("get_n"))


@pytest.mark.parametrize("rows", ROWS)
def test_get_n_equals_per_tensor_path(backend, rows):
    rng = np.random.default_rng(0)
    tensors = _tensors(backend, rng)
    rows_list = [ROWS[rows](len(t)) for t in tensors]
    got = backend.get_n(tensors, rows_list)
    want = Backend.get_n(backend, tensors, rows_list)
    for g, w, t, r in zip(got, want, tensors, rows_list, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, w)
        full = backend.to_numpy(t)
        np.testing.assert_array_equal(g, full if r is None else full[r])


@pytest.mark.parametrize("rows", ROWS)
def test_set_n_equals_per_tensor_path(backend, rows):
    rng = np.random.default_rng(1)
    batched, single = _tensors(backend, rng), _tensors(backend, np.random.default_rng(1))
    rows_list = [ROWS[rows](len(t)) for t in batched]
    srcs = [
        rng.integers(-8, 8, (len(t) if r is None else len(r), *t.shape[1:])).astype(np.float32)
        for t, r in zip(batched, rows_list, strict=True)
    ]
    backend.set_n(batched, rows_list, srcs)
    Backend.set_n(backend, single, rows_list, srcs)
    for b, s, src, r in zip(batched, single, srcs, rows_list, strict=True):
        np.testing.assert_array_equal(backend.to_numpy(b), backend.to_numpy(s))
        got = backend.to_numpy(b)
        np.testing.assert_array_equal(got if r is None else got[r], src)


def test_copy_n_equals_per_tensor_path(backend):
    rng = np.random.default_rng(2)
    srcs = _tensors(backend, rng)
    batched = [backend.zeros(tuple(t.shape)) for t in srcs]
    single = [backend.zeros(tuple(t.shape)) for t in srcs]
    backend.copy_n(batched, srcs)
    Backend.copy_n(backend, single, srcs)
    for b, s, src in zip(batched, single, srcs, strict=True):
        np.testing.assert_array_equal(backend.to_numpy(b), backend.to_numpy(src))
        np.testing.assert_array_equal(backend.to_numpy(s), backend.to_numpy(src))


def test_switch_selects_the_per_tensor_path(monkeypatch):
    torch_backend = RUNTIME.create_backend("torch", device="cpu", dtype="f32")
    calls = []
    monkeypatch.setattr(torch_backend, "get_n", lambda *a: calls.append("batched") or [])
    monkeypatch.setattr(torch_backend, "set_n", lambda *a: calls.append("batched"))
    t = [torch_backend.zeros((4, 1, 2))]
    src = [np.ones((4, 1, 2), dtype=np.float32)]

    monkeypatch.setenv(context_state.BATCHED_COPY_DISABLE_ENV, "1")
    assert context_state.batched_transfers(torch_backend, "get_n") == (
        False,
        "disabled by TESSERA_BATCHED_COPY_DISABLE=1",
    )
    context_state.set_n(torch_backend, t, [None], src)
    np.testing.assert_array_equal(context_state.get_n(torch_backend, t, [None])[0], src[0])
    assert calls == []

    monkeypatch.setenv(context_state.BATCHED_COPY_DISABLE_ENV, "0")
    assert context_state.batched_transfers(torch_backend, "get_n")[0]
    context_state.set_n(torch_backend, t, [None], src)
    context_state.get_n(torch_backend, t, [None])
    assert calls == ["batched", "batched"]


def test_numpy_declines_and_takes_the_per_tensor_path():
    use, why = context_state.batched_transfers(NumpyBackend(), "set_n")
    assert not use and why == "backend numpy does not support set_n"

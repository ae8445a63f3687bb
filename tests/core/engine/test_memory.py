"""Weights or a KV cache the machine cannot hold are refused with the numbers before they
are allocated."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.cli.main import main
from tessera.engine import context as context_module
from tessera.engine.context import Context, ContextParams
from tessera.engine.memory import OutOfMemoryError, available_bytes, kv_cache_bytes, weight_bytes
from tessera.files import load as load_module
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), Runtime(), "numpy")


def test_the_estimate_is_what_the_cache_allocates(model):
    ctx = Context(model, ContextParams(n_ctx=96))
    allocated = sum(t.nbytes for t in [*ctx.kv.k, *ctx.kv.v] if t is not None)
    layout = model.arch.kv_layout(model.config)
    assert kv_cache_bytes(layout, 96, model.backend.dtype) == allocated


def test_a_cache_over_the_free_memory_is_refused_before_it_is_made(model, monkeypatch):
    layout = model.arch.kv_layout(model.config)
    need = kv_cache_bytes(layout, 4096, model.backend.dtype)
    monkeypatch.setattr(context_module, "available_bytes", lambda: need // 4)
    made = []
    monkeypatch.setattr(context_module, "KVCache", lambda *a, **k: made.append(a))
    with pytest.raises(OutOfMemoryError) as refused:
        Context(model, ContextParams(n_ctx=4096))
    message = str(refused.value)
    assert "a context of 4096 tokens needs" in message and "available" in message
    assert "-c 512" in message  # about half of what is free
    assert made == []
    Context(model, ContextParams(n_ctx=512))  # what it suggests fits


def test_run_with_a_context_too_large_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(context_module, "available_bytes", lambda: 1 << 20)
    code = main(["run", "-p", "hi", "-n", "2", "-c", "8192", "--backend", "numpy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err[-1].startswith("error: a context of 8192 tokens needs")


def test_free_memory_is_read_on_linux():
    value = available_bytes()
    assert value is None or (isinstance(value, int) and value > 0)
    if value is not None:
        assert value < (1 << 50) and np.isfinite(value)


def test_the_weight_estimate_is_what_loading_allocates(model):
    from tessera.files.gguf import read_gguf

    runtime = Runtime()
    raw = read_gguf(default_model_path()).tensors
    qtypes = {n: runtime.quant_type(t.ggml_type, n) for n, t in raw.items()}
    need = weight_bytes(raw, qtypes, model.backend, runtime.weight_kernels())
    # the numpy backend dequantizes every tensor to float32
    assert need == sum(np.asarray(w).nbytes for w in model.weights.values())


def test_weights_over_the_free_memory_are_refused_before_loading(monkeypatch):
    monkeypatch.setattr(load_module, "available_bytes", lambda: 1 << 20)
    with pytest.raises(OutOfMemoryError) as refused:
        load_model(default_model_path(), Runtime(), "numpy")
    message = str(refused.value)
    assert "GiB in memory" in message and "available" in message
    assert "smaller quantization" in message


def test_run_with_weights_too_large_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(load_module, "available_bytes", lambda: 1 << 20)
    code = main(["run", "-p", "hi", "-n", "2", "--backend", "numpy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err[-1].startswith("error: this model's")

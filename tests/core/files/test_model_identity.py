"""A model's identity: the same digest as before it was deferred (saved states stay valid),
computed on first use instead of while the model loads, different for another model."""

from __future__ import annotations

import hashlib

import numpy as np

from tessera.files.gguf import read_gguf
from tessera.files.identity import deferred_identity, model_identity
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
#: The bundled model's identity as tessera has always computed it (states saved with it).
DEFAULT_IDENTITY = "0c8be48778108ebaf719b6a2933b790d31ce256706507e6d155fe3c53764119f"


def test_the_bundled_model_keeps_its_identity():
    gguf = read_gguf(default_model_path())
    assert model_identity(gguf.metadata, gguf.tensors) == DEFAULT_IDENTITY


def test_loading_defers_the_hash_to_first_use(monkeypatch):
    calls = []
    real = hashlib.sha256

    def counting_sha256(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(hashlib, "sha256", counting_sha256)
    model = load_model(default_model_path(), RUNTIME, "numpy")
    assert calls == []
    assert model.identity == DEFAULT_IDENTITY
    assert model.identity == DEFAULT_IDENTITY and calls == [1]  # computed once


def test_deferred_identity_copies_the_tensor_heads_at_once():
    gguf = read_gguf(default_model_path())
    raw = dict(gguf.tensors)
    later = deferred_identity(gguf.metadata, raw)
    name = sorted(raw)[0]
    changed = raw[name].data.copy()
    changed[:4] ^= np.uint8(1)
    other = dict(
        raw, **{name: type(raw[name])(name, raw[name].ggml_type, raw[name].shape, changed)}
    )
    raw.clear()  # the tensors may be gone by the time the identity is asked
    assert later() == DEFAULT_IDENTITY
    assert model_identity(gguf.metadata, other) != DEFAULT_IDENTITY

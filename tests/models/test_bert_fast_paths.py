"""The ``bert`` graph's fast paths and their switches, each path against an oracle.

- one fused Q/K/V dense layer (``TESSERA_BERT_FUSED_QKV``) vs three: transformers' hidden
  states, on numpy and torch f32 (tolerance as test_bert_parity);
- the torch backend in bf16 with packed oneDNN weights and fused GELU / residual
  epilogues (``TESSERA_TORCH_PACKED_LINEAR``) or plain ``F.linear``, and with or without
  ``torch.inference_mode`` (``TESSERA_TORCH_INFERENCE_MODE``): the numpy reference within
  bf16 rounding, for one input (dense attention) and a packed batch (attention rows).
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.engine.embed import Embedder
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.bert_models import PARITY_SENTENCES, hf_last_hidden, make_bert_hf_dir

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
TOL = 1e-4  # max abs on hidden states of std ~1 (as test_bert_parity)
SENTENCES = PARITY_SENTENCES


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return make_bert_hf_dir(tmp_path_factory.mktemp("bert-fast") / "bert-tiny")


def _placement(model, what):
    return [p[1:] for p in model.backend.placements if p[0] == what]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused_qkv", ["", "0"])
def test_qkv_paths_match_transformers(encoder, backend, fused_qkv, monkeypatch):
    folder, model = encoder
    monkeypatch.setenv("TESSERA_BERT_FUSED_QKV", fused_qkv)
    tm = load_model(folder, RUNTIME, backend, dtype="f32")
    if fused_qkv == "0":
        assert _placement(tm, "bert q/k/v") == [
            ("three dense layers", "disabled by TESSERA_BERT_FUSED_QKV=0")
        ]
    else:
        assert _placement(tm, "bert q/k/v") == [
            ("one fused dense layer", "q/k/v weights concatenated at load")
        ]
    hidden, mask = hf_last_hidden(folder, model, SENTENCES)
    raw = Embedder(tm, normalize=-1)
    for i, text in enumerate(SENTENCES):
        got = raw.token_embeddings(raw.tokenize(text))
        np.testing.assert_allclose(got, hidden[i][mask[i]], atol=TOL)
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    got = Embedder(tm, pooling="mean", normalize=-1).embed([raw.tokenize(t) for t in SENTENCES])
    np.testing.assert_allclose(got, mean, atol=TOL)


def test_qkv_stays_unfused_without_the_linear_op(encoder, monkeypatch):
    monkeypatch.setenv("TESSERA_FUSED_LINEAR_DISABLE", "1")
    tm = load_model(encoder[0], RUNTIME, "numpy")
    assert _placement(tm, "bert q/k/v") == [
        ("three dense layers", "dense layers run as matmul + add")
    ]


# Real skip: the torch backend is an entry-point plugin that an install may lack; the
# numpy cases above still run. The project's own install (and CI) has it.
@pytest.mark.skipif("torch" not in BACKENDS, reason="torch backend not installed")
@pytest.mark.parametrize(
    "switches",
    [
        {},
        {"TESSERA_TORCH_PACKED_LINEAR": "0"},
        {"TESSERA_BERT_FUSED_QKV": "0", "TESSERA_TORCH_INFERENCE_MODE": "0"},
    ],
    ids=["default", "packed-off", "qkv-and-inference-mode-off"],
)
def test_bf16_torch_paths_match_numpy(encoder, switches, monkeypatch):
    folder, _ = encoder
    ref = load_model(folder, RUNTIME, "numpy")
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    tm = load_model(folder, RUNTIME, "torch", dtype="bf16")
    emb, want = Embedder(tm, normalize=-1), Embedder(ref, normalize=-1)
    tokens = [want.tokenize(t) for t in SENTENCES]
    # bf16 weights and activations through two layers: ~1e-2 off on values of std ~1
    for toks in tokens:
        np.testing.assert_allclose(
            emb.token_embeddings(toks), want.token_embeddings(toks), atol=6e-2
        )
    np.testing.assert_allclose(emb.embed(tokens), want.embed(tokens), rtol=2e-2, atol=3e-2)
    packed = _placement(tm, "linear weights")
    assert len(packed) == 1
    assert (packed[0][0] == "packed") is (
        "TESSERA_TORCH_PACKED_LINEAR" not in switches and tm.backend._packed_linear.ok
    )

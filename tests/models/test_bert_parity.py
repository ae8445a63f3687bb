"""The ``bert`` architecture against HF transformers on random-weight checkpoints.

Each case is a genuine checkpoint made by ``transformers`` (``BertModel`` or
``BertForSequenceClassification``, float32, every 1-D parameter perturbed so a loader that
drops one fails). tessera loads it from the safetensors folder and from the GGUF
``tessera convert`` writes, on every installed backend in f32, and must reproduce
transformers' per-token hidden states, its mean/cls pooling over a padded batch, and a
reranker's classifier logits with segment ids. Tolerance: 1e-4 max abs on hidden states of
std ~1 (measured ~1e-6).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tessera.engine.embed import Embedder
from tessera.errors import TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.bert_models import PARITY_SENTENCES, hf_last_hidden, make_bert_hf_dir

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
TOL = 1e-4


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert")
    folder, model = make_bert_hf_dir(tmp / "bert-tiny")
    gguf = convert_hf_to_gguf(folder, tmp / "bert-tiny-f32.gguf", RUNTIME, "f32")
    return {"hf": folder, "gguf": gguf}, model


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert-rank")
    folder, model = make_bert_hf_dir(tmp / "bert-rank", classifier=True, seed=1)
    gguf = convert_hf_to_gguf(folder, tmp / "bert-rank-f32.gguf", RUNTIME, "f32")
    return {"hf": folder, "gguf": gguf}, model


SENTENCES = PARITY_SENTENCES


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_hidden_states_and_pooling_match_transformers(encoder, source, backend):
    files, model = encoder
    hidden, mask = hf_last_hidden(files["hf"], model, SENTENCES)
    tm = load_model(files[source], RUNTIME, backend, dtype="f32")
    raw = Embedder(tm, normalize=-1)
    for i, text in enumerate(SENTENCES):
        got = raw.token_embeddings(raw.tokenize(text))
        np.testing.assert_allclose(got, hidden[i][mask[i]], atol=TOL)
    tokens = [raw.tokenize(t) for t in SENTENCES]
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(
        Embedder(tm, pooling="mean", normalize=-1).embed(tokens), mean, atol=TOL
    )
    np.testing.assert_allclose(
        Embedder(tm, pooling="cls", normalize=-1).embed(tokens), hidden[:, 0], atol=TOL
    )


def test_packing_splits_forwards_without_changing_results(encoder):
    files, _ = encoder
    tm = load_model(files["gguf"], RUNTIME, "numpy")
    tokens = [Embedder(tm).tokenize(t) for t in SENTENCES * 3]
    one_forward = Embedder(tm).embed(tokens)
    small = Embedder(tm, n_batch=40, n_seq_max=2)  # forces several forwards
    assert small._packs([len(t) for t in tokens]).__len__() > 1
    np.testing.assert_allclose(small.embed(tokens), one_forward, atol=1e-6)
    alone = np.concatenate([Embedder(tm).embed([t]) for t in tokens])
    np.testing.assert_allclose(alone, one_forward, atol=1e-6)


def test_gelu_fallback_is_the_tanh_form(encoder, monkeypatch):
    """A backend that declines gelu_erf gets llama.cpp's tanh GELU: close, not identical."""
    files, model = encoder
    from tessera.backends.numpy import NumpyBackend

    class NoErf(NumpyBackend):
        def supports(self, op):
            return op.name != "gelu_erf" and super().supports(op)

    exact = load_model(files["gguf"], RUNTIME, "numpy")
    approx = load_model(files["gguf"], RUNTIME, NoErf())
    assert ("bert gelu", "gelu (tanh)", "backend declines gelu_erf") in approx.backend.placements
    toks = Embedder(exact).tokenize(SENTENCES[0])
    a = Embedder(exact, normalize=-1).token_embeddings(toks)
    b = Embedder(approx, normalize=-1).token_embeddings(toks)
    assert 1e-7 < np.abs(a - b).max() < 1e-2


def test_unfused_dense_layers_give_the_same_result(encoder, monkeypatch):
    files, _ = encoder
    fused = load_model(files["gguf"], RUNTIME, BACKENDS[-1], dtype="f32")
    monkeypatch.setenv("TESSERA_FUSED_LINEAR_DISABLE", "1")
    plain = load_model(files["gguf"], RUNTIME, BACKENDS[-1], dtype="f32")
    assert ("bert dense layers", "matmul + add", "disabled by TESSERA_FUSED_LINEAR_DISABLE=1") in (
        plain.backend.placements
    )
    toks = [Embedder(fused).tokenize(t) for t in SENTENCES]
    np.testing.assert_allclose(Embedder(fused).embed(toks), Embedder(plain).embed(toks), atol=1e-6)


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_reranker_scores_match_transformers(reranker, source, backend):
    files, model = reranker
    query = "what does a fox jump over?"
    docs = ["The quick brown fox jumps over the lazy dog.", "Bananas are yellow.", "dogs"]
    tok = transformers.AutoTokenizer.from_pretrained(files["hf"])
    enc = tok([query] * len(docs), docs, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits.numpy()[:, 0]
    tm = load_model(files[source], RUNTIME, backend, dtype="f32")
    emb = Embedder(tm)
    assert emb.is_reranker and emb.pooling == "rank" and emb.classifier_activation == "none"
    ids, types = emb.pair_tokens(query, docs[0])
    n = int(enc["attention_mask"][0].sum())
    assert ids == enc["input_ids"][0, :n].tolist()
    assert types == enc["token_type_ids"][0, :n].tolist()
    np.testing.assert_allclose(emb.rerank(query, docs), logits, atol=TOL)
    sig = Embedder(tm, classifier_activation="sigmoid").rerank(query, docs)
    np.testing.assert_allclose(sig, 1 / (1 + np.exp(-logits)), atol=TOL)


def test_bert_refuses_to_generate(encoder):
    from tessera.engine.batch import Batch
    from tessera.engine.context import Context

    tm = load_model(encoder[0]["gguf"], RUNTIME, "numpy")
    with pytest.raises(TesseraError, match="no LM head"):
        Context(tm).decode(Batch.for_sequence([101, 7592, 102]))


def test_sentence_transformers_dense_module_is_applied_after_pooling(tmp_path):
    """A BERT sentence-transformers folder with a Dense projection: mean pool, then W."""
    import json

    from tessera.testing.sentence_transformers import write_sentence_transformers_modules

    folder, model = make_bert_hf_dir(tmp_path / "st-dense", seed=3)
    w = torch.randn(32, 64) * 0.1
    write_sentence_transformers_modules(folder, [w.numpy()])
    cfg = json.loads((folder / "2_Dense" / "config.json").read_text())
    hidden, mask = hf_last_hidden(folder, model, SENTENCES)
    mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    gguf = convert_hf_to_gguf(folder, tmp_path / "st-dense.gguf", RUNTIME, "f32")
    for source in (folder, gguf):
        emb = Embedder(load_model(source, RUNTIME, "numpy"), normalize=-1)
        assert emb.n_embd == 32  # the projection's width, not the encoder's
        got = emb.embed([emb.tokenize(t) for t in SENTENCES])
        np.testing.assert_allclose(got, mean @ w.numpy().T, atol=TOL)
    cfg["activation_function"] = "torch.nn.modules.activation.Tanh"
    (folder / "2_Dense" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TesseraError, match="has a bias or an activation"):
        load_model(folder, RUNTIME, "numpy")

"""llama-server's native /embedding (and /embeddings) and /reranking with plain HTTP: the
shape of its answers (a list of ``{index, embedding: [vectors]}``; Jina's and TEI's rerank
forms), the vectors against the OpenAI route and the embedding engine."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.engine.embed import Embedder
from tessera.plugins.server.testing import call, live_server
from tessera.testing.bert_models import make_bert_hf_dir

TEXTS = ["The little dog runs.", "Rain tomorrow"]


@pytest.fixture(scope="module")
def per_token():
    """The bundled model with its own pooling (none): a vector per token."""
    with live_server(["--backend", "numpy", "-np", "1", "-c", "256"]) as srv:
        yield srv


def test_a_pooled_embedding_is_the_openai_routes_vector(server):
    # the conftest server pools by mean
    native = call(server.url + "/embedding", {"content": TEXTS})
    assert native.status == 200
    oai = call(server.v1 + "/embeddings", {"input": TEXTS}).json["data"]
    assert [e["index"] for e in native.json] == [0, 1]
    for entry, want in zip(native.json, oai, strict=True):
        assert set(entry) == {"index", "embedding"} and len(entry["embedding"]) == 1
        assert np.allclose(entry["embedding"][0], want["embedding"], atol=1e-6)
    # /embeddings without /v1 is this route too, and "input" is taken for "content"
    alias = call(server.url + "/embeddings", {"input": TEXTS[0]}).json
    assert np.allclose(alias[0]["embedding"][0], oai[0]["embedding"], atol=1e-6)


def test_embd_normalize_picks_the_norm(server):
    raw = call(server.url + "/embedding", {"content": TEXTS[0], "embd_normalize": -1}).json
    vec = np.asarray(raw[0]["embedding"][0])
    engine = Embedder(server.model.model, pooling="mean", normalize=-1)
    want = engine.embed([server.model.tokenizer.encode(TEXTS[0], parse_special=True)])[0]
    assert np.allclose(vec, want, atol=1e-5) and not np.isclose(np.linalg.norm(vec), 1.0)
    taxicab = call(server.url + "/embedding", {"content": TEXTS[0], "embd_normalize": 1}).json
    assert np.isclose(np.abs(taxicab[0]["embedding"][0]).sum(), 1.0, atol=1e-5)


def test_pooling_none_gives_a_raw_vector_per_token(per_token):
    tok = per_token.model.tokenizer
    answer = call(per_token.url + "/embedding", {"content": TEXTS})
    assert answer.status == 200
    engine = Embedder(per_token.model.model)
    for entry, text in zip(answer.json, TEXTS, strict=True):
        ids = tok.encode(text, add_special=True, parse_special=True)
        want = engine.token_embeddings(ids, normalize=-1)
        got = np.asarray(entry["embedding"])
        assert got.shape == (len(ids), want.shape[1])
        assert np.allclose(got, want, atol=1e-5)
    # OpenAI's route has no per-token form
    assert call(per_token.v1 + "/embeddings", {"input": TEXTS[0]}).status == 400


def test_refusals_have_llama_servers_shape(server):
    nothing = call(server.url + "/embedding", {})
    assert nothing.status == 400 and nothing.json["error"]["code"] == 400
    long = call(server.url + "/embedding", {"content": [100] * 600})
    error = long.json["error"]
    assert long.status == 400 and error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] == 600 and error["n_ctx"] < 600


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path, _ = make_bert_hf_dir(tmp_path_factory.mktemp("rr") / "reranker", classifier=True, seed=5)
    with live_server(["-m", str(path), "--backend", "numpy", "-np", "1"]) as srv:
        yield srv


DOCS = ["a dog runs", "the stock market fell", "cats and dogs", "rain tomorrow"]
QUERY = "where is the dog?"


def test_reranking_in_jina_and_tei_form(reranker):
    want = Embedder(reranker.model.model).rerank(QUERY, DOCS)
    order = list(np.argsort(-np.asarray(want), kind="stable"))
    jina = call(reranker.url + "/reranking", {"query": QUERY, "documents": DOCS, "top_n": 2}).json
    assert (jina["object"], jina["model"]) == ("list", reranker.model.name)
    assert [r["index"] for r in jina["results"]] == order[:2]
    engine = Embedder(reranker.model.model)
    n_tokens = sum(len(engine.pair_tokens(QUERY, d)[0]) for d in DOCS)
    assert jina["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    tei = call(reranker.v1 + "/reranking", {"query": QUERY, "texts": DOCS, "return_text": True})
    assert isinstance(tei.json, list) and [r["index"] for r in tei.json] == order
    for r in tei.json:
        assert set(r) == {"index", "score", "text"} and r["text"] == DOCS[r["index"]]
        assert r["score"] == pytest.approx(float(want[r["index"]]), abs=1e-5)
    empty = call(reranker.url + "/rerank", {"query": QUERY, "texts": []})
    assert empty.status == 400

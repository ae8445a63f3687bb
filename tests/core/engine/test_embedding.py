"""The embedding engine: normalization, Matryoshka truncation, decoder pooling against
transformers, and embedding mode never touching the LM head or a logits buffer."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
import torch
import transformers

from tessera.backends.numpy import NumpyBackend
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.embed import Embedder, apply_activation, normalize
from tessera.errors import TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf, make_hf_dir

RUNTIME = Runtime()


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("emb") / "llama.gguf", "llama")


@pytest.fixture(scope="module")
def bert_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("emb") / "bert.gguf", "bert", n_ctx_train=32)


def test_normalize_modes_follow_llama_cpp():
    x = np.array([[3.0, -4.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    np.testing.assert_array_equal(normalize(x, -1), x)
    np.testing.assert_allclose(normalize(x, 0)[0], [3 * 32760 / 4, -32760, 0])
    np.testing.assert_allclose(normalize(x, 1)[0], [3 / 7, -4 / 7, 0])
    np.testing.assert_allclose(normalize(x, 2)[0], [0.6, -0.8, 0])
    p3 = (27 + 64) ** (1 / 3)
    np.testing.assert_allclose(normalize(x, 3)[0], [3 / p3, -4 / p3, 0], rtol=1e-6)
    assert not normalize(x, 2)[1].any()  # a zero vector stays zero, no NaN
    # a p whose powers overflow float64 (|x|^p) still gives the p-norm, close to max|x|
    with np.errstate(all="raise"):
        np.testing.assert_allclose(normalize(x * 1e3, 400)[0], [0.75, -1.0, 0], rtol=1e-6)


def test_classifier_activations():
    s = np.array([[0.0, 2.0]], dtype=np.float32)
    np.testing.assert_allclose(apply_activation(s, "sigmoid"), [[0.5, 1 / (1 + np.exp(-2))]])
    np.testing.assert_allclose(apply_activation(s, "softmax").sum(), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(apply_activation(s, "none"), s)
    with pytest.raises(TesseraError, match="unknown classifier activation"):
        apply_activation(s, "relu")


def test_mrl_truncates_then_renormalizes(bert_gguf):
    model = load_model(bert_gguf, RUNTIME, "numpy")
    tokens = [[1, 5, 9, 2], [7, 7, 3]]
    raw = Embedder(model, normalize=-1).embed(tokens)
    cut = Embedder(model).embed(tokens, dims=16)
    assert cut.shape == (2, 16)
    np.testing.assert_allclose(
        cut, raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1)[:, None], rtol=1e-5
    )
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, rtol=1e-6)


def test_bad_dimensions_are_rejected_with_the_allowed_values(bert_gguf):
    model = load_model(bert_gguf, RUNTIME, "numpy")
    emb = Embedder(model)
    for bad in (0, 65):
        with pytest.raises(TesseraError, match=r"outside 1\.\.64"):
            emb.embed([[1, 2]], dims=bad)
    mrl = Embedder(model, mrl_dims=[16, 32, 64])
    with pytest.raises(TesseraError, match="16, 32, 64"):
        mrl.embed([[1, 2]], dims=20)
    assert mrl.embed([[1, 2]], dims=32).shape == (1, 32)


def test_input_longer_than_the_context_is_refused(bert_gguf):
    emb = Embedder(load_model(bert_gguf, RUNTIME, "numpy"))
    assert emb.n_ctx == 32
    with pytest.raises(TesseraError, match="input 1 has 33 tokens but the context holds 32"):
        emb.embed([[1, 2], [3] * 33])
    with pytest.raises(TesseraError, match="input 0 is empty"):
        emb.embed([[]])


def test_decoder_pooling_matches_transformers(tmp_path):
    """mean / last pooling of a llama model = transformers' final hidden states (normed)."""
    folder = make_hf_dir(tmp_path / "llama", "llama")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = load_model(folder, RUNTIME, "numpy")
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, model.n_vocab, n).tolist() for n in (5, 9, 3)]
    with torch.no_grad():
        hidden = [hf.model(torch.tensor([t])).last_hidden_state[0].numpy() for t in inputs]
    mean = Embedder(model, pooling="mean", normalize=-1, n_ubatch=4).embed(inputs)
    last = Embedder(model, pooling="last", normalize=-1).embed(inputs)
    np.testing.assert_allclose(mean, [h.mean(0) for h in hidden], atol=1e-5)
    np.testing.assert_allclose(last, [h[-1] for h in hidden], atol=1e-5)


class CountingBackend(NumpyBackend):
    """Records the width of every matmul result: the LM head is the one n_vocab wide."""

    def __init__(self):
        super().__init__()
        self.widths: list[int] = []

    def matmul(self, x, w):
        y = super().matmul(x, w)
        self.widths.append(y.shape[-1])
        return y


def test_embedding_mode_never_runs_the_lm_head(llama_gguf):
    backend = CountingBackend()
    model = load_model(llama_gguf, RUNTIME, backend)
    ctx = Context(model, ContextParams(n_ctx=64, n_seq_max=4))
    batch = Batch.concat([Batch.for_sequence([1, 2, 3, 4], 0, s) for s in range(3)])
    pooled = ctx.encode(batch, "mean")
    assert pooled.shape == (3, model.config.n_embd)
    assert model.n_vocab not in backend.widths
    assert ctx.output_buffers == {"embd": 1}
    assert ctx.kv.n_used == 0  # nothing stays in the cache
    ctx.decode(batch)
    assert model.n_vocab in backend.widths and ctx.output_buffers["logits"] == 1


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_pooled_peak_memory_is_far_below_logits_mode(llama_gguf):
    """numpy arrays are traced by tracemalloc: compare the same tokens in both modes. The
    logits of all rows grow with the batch (512 x 4096 floats); compute buffers grow with
    the ubatch (64 rows), which both modes share."""
    model = load_model(llama_gguf, RUNTIME, "numpy")
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_ubatch=64, n_seq_max=8))
    rng = np.random.default_rng(0)
    batch = Batch.concat(
        [Batch.for_sequence(rng.integers(0, 4096, 64), 0, s, "all") for s in range(8)]
    )
    ctx.encode(batch, "mean")  # warm caches outside the measurement
    pooled = _peak_bytes(lambda: ctx.encode(batch, "mean"))
    logits = _peak_bytes(lambda: ctx.kv.clear() or ctx.decode(batch))
    assert pooled * 3 < logits, (pooled, logits)


def test_embed_texts_takes_texts_and_token_lists_and_counts_tokens(bert_gguf):
    emb = Embedder(load_model(bert_gguf, RUNTIME, "numpy"))
    ids = emb.tokenize("hello there")
    vecs, n_tokens = emb.embed_texts(["hello there", [5, 6, 7]])
    assert n_tokens == len(ids) + 3
    np.testing.assert_allclose(vecs, emb.embed([ids, [5, 6, 7]]), atol=1e-6)

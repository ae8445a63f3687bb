"""The chunks llama-perplexity scores: counts and the too-short refusal; the scored logits
of every chunk, however they are batched, against one plain decode per chunk."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import TesseraError
from tessera.files.gguf import read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.perplexity_chunks import (
    ChunkPlan,
    chunk_context,
    plan_chunks,
    scored_logits,
)

RUNTIME = Runtime()


def test_plan_counts_whole_chunks_and_caps_them():
    plan = plan_chunks(2682, 512, 2048, -1, None)
    assert (plan.n_chunk, plan.first, plan.n_scored, plan.n_seq) == (5, 256, 255, 4)
    assert plan_chunks(2682, 512, 2048, 3, None).n_chunk == 3
    assert plan_chunks(2682, 512, 256, -1, None).n_seq == 1
    assert plan_chunks(100, 32, 2048, -1, None).n_seq == 3  # never more than the chunks
    assert ChunkPlan(n_ctx=33, n_batch=33, n_chunk=1).n_scored == 33 - 1 - 16


def test_a_text_shorter_than_two_chunks_is_refused_naming_both_counts():
    with pytest.raises(TesseraError) as info:
        plan_chunks(1000, 512, 2048, -1, None)
    message = str(info.value)
    assert "1000 tokens" in message and "at least 1024" in message and "-c 512" not in message
    assert "a context of 512" in message and "smaller -c" in message
    assert plan_chunks(1024, 512, 2048, -1, None).n_chunk == 2


@pytest.fixture(scope="module")
def bos_model(tmp_path_factory):
    """The bundled model, told to add BOS (id 0, ``<|endoftext|>``) to every text."""
    gguf = read_gguf(default_model_path())
    path = tmp_path_factory.mktemp("bos") / "bos.gguf"
    metadata = {**gguf.metadata, "tokenizer.ggml.add_bos_token": True}
    write_gguf(path, metadata, list(gguf.tensors.values()))
    return load_model(path, RUNTIME, "torch", dtype="f32")


def one_chunk_at_a_time(model, tokens, n_ctx: int, n_chunk: int, bos: int | None) -> list:
    """The oracle: each chunk decoded alone from an empty cache, its logits sliced."""
    out = []
    for c in range(n_chunk):
        chunk = np.array(tokens[c * n_ctx : (c + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_ctx))
        logits = ctx.decode(Batch.for_sequence(chunk, logits="all"))
        out.append(
            (logits[n_ctx // 2 : n_ctx - 1], tokens[c * n_ctx + n_ctx // 2 + 1 : (c + 1) * n_ctx])
        )
    return out


@pytest.mark.parametrize(
    ("n_batch", "n_seq"),
    [(32, 1), (96, 3), (2048, 7), (10, 1)],  # one chunk, 3 + 3 + 1, all 7, pieces of 10
)
def test_scored_logits_equal_a_plain_decode_of_each_chunk(bos_model, n_batch, n_seq):
    text = "def f(x):\n    return x + 1\n" * 40
    tokens = bos_model.tokenizer.encode(text)
    assert tokens[0] == 0 and tokens[1] != 0  # BOS added by the vocabulary
    plan = plan_chunks(len(tokens), 32, n_batch, 7, bos_model.tokenizer.bos_id)
    assert plan.n_seq == n_seq
    got = list(scored_logits(chunk_context(bos_model, plan, 512, "auto"), tokens, plan))
    expected = one_chunk_at_a_time(bos_model, tokens, 32, 7, bos=0)
    assert [index for index, _, _ in got] == list(range(7))
    for (_, logits, nxt), (want, want_next) in zip(got, expected, strict=True):
        assert logits.shape == (15, bos_model.n_vocab)
        assert nxt.tolist() == list(want_next)
        # same weights and inputs, other batch shapes: float32 summation order only
        assert np.abs(logits - want).max() < 1e-4 * np.abs(want).max()


def test_bos_is_put_at_the_start_of_every_chunk(bos_model):
    tokens = bos_model.tokenizer.encode("x = [1, 2, 3]\nprint(x)\n" * 40)
    plan = plan_chunks(len(tokens), 32, 32, 3, bos_model.tokenizer.bos_id)
    got = [g[1] for g in scored_logits(chunk_context(bos_model, plan, 512, "auto"), tokens, plan)]
    without = one_chunk_at_a_time(bos_model, tokens, 32, 3, bos=None)
    # chunk 0 starts with BOS anyway; the others change when their first token is replaced
    assert np.abs(got[0] - without[0][0]).max() < 1e-4
    assert all(np.abs(got[c] - without[c][0]).max() > 1e-2 for c in (1, 2))

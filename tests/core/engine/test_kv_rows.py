"""The rows path over the unified KV cache: row lists, the attention_rows op against the
dense-mask path and the numpy reference, path selection, and generation on both paths."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.arch import KVLayerLayout
from tessera.contract.ops import op
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams, choose_kv_path
from tessera.engine.kv_cache import KVCache
from tessera.errors import ContextOverflowError, TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf

RUNTIME = Runtime()
NUMPY = NumpyBackend()


@pytest.fixture(scope="module")
def torch_f32():
    return RUNTIME.create_backend("torch", device="cpu", dtype="f32")


def _random_cache(rng, n_seq, n_cells=96, n_head_kv=2, dim=8):
    """A cache with ragged sequences written in interleaved chunks, and holes in it."""
    cache = KVCache(NUMPY, [KVLayerLayout(n_head_kv, dim, dim)], n_cells, n_seq)
    next_pos = np.zeros(n_seq, dtype=int)
    for _ in range(3 * n_seq):
        seq, n = int(rng.integers(n_seq)), int(rng.integers(1, 7))
        pos = np.arange(next_pos[seq], next_pos[seq] + n)
        cache.commit(cache.find_slot(n), pos, np.full(n, seq))
        next_pos[seq] += n
    # Free a few cells of the first sequence, then refill: cells out of position order.
    cache.seq_rm(0, 1, 3)
    cache.commit(cache.find_slot(2), np.array([1, 2]), np.array([0, 0]))
    cache.k[0][:] = rng.standard_normal(cache.k[0].shape)
    cache.v[0][:] = rng.standard_normal(cache.v[0].shape)
    return cache, next_pos


def _random_queries(rng, next_pos, n_tokens):
    """Queries at positions each sequence already holds (some before its history starts)."""
    seqs = rng.integers(len(next_pos), size=n_tokens)
    positions = np.array([rng.integers(0, max(next_pos[s], 1)) for s in seqs])
    return positions.astype(np.int32), seqs.astype(np.int32)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("window", [0, 3, 11])
def test_rows_path_equals_dense_path_equals_reference(seed, group, window, torch_f32):
    rng = np.random.default_rng(seed)
    cache, next_pos = _random_cache(rng, n_seq=int(rng.integers(2, 6)))
    positions, seqs = _random_queries(rng, next_pos, int(rng.integers(1, 12)))
    q = rng.standard_normal((len(seqs), 2 * group, 8)).astype(np.float32)
    n_kv, scale = cache.n_kv(), 0.4
    mask = cache.mask(positions, seqs, n_kv, window)
    kv_rows = cache.rows(positions, seqs, n_kv, window)
    k, v = cache.k[0], cache.v[0]

    reference = NUMPY.attention(q, k, v, n_kv, mask, scale)
    np.testing.assert_allclose(NUMPY.attention_rows(q, k, v, kv_rows, scale), reference, atol=1e-5)
    t = torch_f32
    tk, tv, tq = t.from_numpy(k), t.from_numpy(v), t.from_numpy(q)
    rows_out = t.to_numpy(t.attention_rows(tq, tk, tv, kv_rows, scale))
    dense_out = t.to_numpy(t.attention(tq, tk, tv, n_kv, mask, scale))
    np.testing.assert_allclose(rows_out, reference, atol=1e-5)
    np.testing.assert_allclose(dense_out, reference, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("window", [0, 7])
def test_a_prompt_into_an_empty_cache_takes_the_causal_kernel(dtype, window):
    """One sequence's queries over exactly its own rows: torch runs SDPA's causal kernel
    without a mask (a sliding window, or a second chunk, keeps the mask), and every
    output matches the numpy reference."""
    t = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    rng = np.random.default_rng(5)
    n, group = 40, 3  # more queries than the native decode kernel takes
    cache = KVCache(NUMPY, [KVLayerLayout(2, 16, 16)], 64, 1)
    cache.commit(cache.find_slot(n), np.arange(n), np.zeros(n))
    cache.k[0][:] = rng.standard_normal(cache.k[0].shape)
    cache.v[0][:] = rng.standard_normal(cache.v[0].shape)
    k, v = (t.to_numpy(t.from_numpy(a)) for a in (cache.k[0], cache.v[0]))  # as the dtype
    tk, tv = t.from_numpy(k), t.from_numpy(v)
    for first in (0, 25):  # the whole prompt; then its last 15 tokens as a second chunk
        positions = np.arange(first, n, dtype=np.int32)
        seqs = np.zeros(len(positions), dtype=np.int32)
        kv_rows = cache.rows(positions, seqs, cache.n_kv(), window)
        q = t.to_numpy(t.from_numpy(rng.standard_normal((len(positions), 2 * group, 16))))
        mask = cache.mask(positions, seqs, cache.n_kv(), window)
        want = NUMPY.attention(q.astype(np.float32), k, v, cache.n_kv(), mask, 0.25)
        got = t.to_numpy(t.attention_rows(t.from_numpy(q), tk, tv, kv_rows, 0.25))
        np.testing.assert_allclose(got, want, atol=1e-5 if dtype == "f32" else 3e-2)
        tensors = t._rows_tensors(kv_rows)
        assert tensors["causal"] == (first == 0 and window == 0)
        assert (tensors["mask"] is None) == tensors["causal"]


def test_rows_lists_each_sequence_in_position_order_with_padding():
    cache = KVCache(NUMPY, [None], 16, 3)
    cache.commit(np.arange(0, 4), np.arange(4), np.zeros(4))  # seq 0: pos 0-3 in cells 0-3
    cache.commit(np.arange(4, 6), np.arange(2), np.ones(2))  # seq 1: pos 0-1 in cells 4-5
    cache.commit(np.array([6, 7]), np.array([5, 4]), np.zeros(2))  # seq 0: pos 5, 4
    cache.seq_cp(0, 2, 0, 2)  # seq 2 shares seq 0's first two cells
    kv_rows = cache.rows(np.array([5, 1, 1, 4]), np.array([0, 1, 2, 0]), cache.n_kv())
    assert kv_rows.rows.tolist() == [
        [0, 1, 2, 3, 7, 6],  # causal order: position 4 (cell 7) before 5 (cell 6)
        [4, 5, -1, -1, -1, -1],
        [0, 1, -1, -1, -1, -1],
    ]
    assert kv_rows.q_rows.tolist() == [[0, 3], [1, -1], [2, -1]]
    assert kv_rows.pos[0].tolist() == [0, 1, 2, 3, 4, 5]
    # Each ubatch row finds its own query slot back.
    assert kv_rows.q_rows.ravel()[kv_rows.q_index].tolist() == [0, 1, 2, 3]
    # A slice keeps only what its queries may see: the window trims the old cells.
    trimmed = cache.rows(np.array([5]), np.array([0]), cache.n_kv(), window=2)
    assert trimmed.rows.tolist() == [[7, 6]]
    two = cache.rows(np.array([5, 3]), np.array([0, 0]), cache.n_kv(), window=2)
    assert two.rows.tolist() == [[2, 3, 7, 6]]  # positions 2..5: what either query sees
    np.testing.assert_array_equal(two.allowed()[0].astype(int), [[0, 0, 1, 1], [1, 1, 0, 0]])


def test_window_mask_sees_only_the_last_positions():
    cache = KVCache(NUMPY, [None], 8, 1)
    cache.commit(np.arange(6), np.arange(6), np.zeros(6))
    mask = cache.mask(np.array([5, 2]), np.array([0, 0]), 6, window=3)
    assert mask.astype(int).tolist() == [[0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0]]


def test_padding_rows_read_nothing_even_when_the_cell_holds_nan(torch_f32):
    cache = KVCache(NUMPY, [KVLayerLayout(1, 4, 4)], 8, 2)
    cache.commit(np.array([1, 2, 3]), np.arange(3), np.zeros(3))
    cache.commit(np.array([4]), np.array([0]), np.ones(1))
    k = np.full((8, 1, 4), np.nan, np.float32)
    v = np.full((8, 1, 4), np.nan, np.float32)
    k[1:5], v[1:5] = 1.0, 2.0
    kv_rows = cache.rows(np.array([2, 0]), np.array([0, 1]), cache.n_kv())
    assert kv_rows.padded
    q = np.ones((2, 2, 4), np.float32)
    np.testing.assert_array_equal(NUMPY.attention_rows(q, k, v, kv_rows, 0.5), 2.0)
    t = torch_f32
    out = t.attention_rows(t.from_numpy(q), t.from_numpy(k), t.from_numpy(v), kv_rows, 0.5)
    np.testing.assert_array_equal(t.to_numpy(out), 2.0)


def test_split_cache_keeps_each_sequence_in_its_own_stream():
    cache = KVCache(NUMPY, [None], 12, 3, unified=False)
    cells = cache.find_slot(4, np.array([1, 1, 2, 0]))
    assert cells.tolist() == [4, 5, 8, 0]
    cache.commit(cells, np.array([0, 1, 0, 0]), np.array([1, 1, 2, 0]))
    assert cache.find_slot(2, np.array([1, 1])).tolist() == [6, 7]
    with pytest.raises(ContextOverflowError, match="only 3 of 4 are free"):
        cache.find_slot(4, np.array([0, 0, 0, 0]))


# -- path selection -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "tiny-gqa.gguf"
    return make_gguf(path, "qwen2", n_embd=64, n_head=4, n_head_kv=2, n_layer=2, seed=3)


@pytest.fixture(scope="module")
def torch_model(tiny_gguf):
    return load_model(tiny_gguf, RUNTIME, RUNTIME.create_backend("torch", "cpu", "f32"))


@pytest.fixture(scope="module")
def numpy_model(tiny_gguf):
    return load_model(tiny_gguf, RUNTIME, "numpy")


@pytest.mark.parametrize(
    ("env", "params", "path", "why"),
    [
        (None, {"flash_attn": "on"}, "rows", "unified, -fa on, backend torch supports"),
        (None, {"flash_attn": "auto"}, "rows", "unified, -fa auto"),
        ("0", {"flash_attn": "on"}, "rows", "unified"),
        ("1", {"flash_attn": "on"}, "dense", "disabled by TESSERA_KV_ROWS_DISABLE=1"),
        (None, {"flash_attn": "off"}, "dense", "-fa off"),
        (None, {"flash_attn": "on", "kv_unified": False}, "dense", "not unified"),
    ],
)
def test_path_selection_on_a_backend_that_supports_rows(
    torch_model, monkeypatch, env, params, path, why
):
    if env is None:
        monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TESSERA_KV_ROWS_DISABLE", env)
    ctx = Context(torch_model, ContextParams(n_ctx=32, n_seq_max=2, **params))
    assert ctx.kv_path == path and why in ctx.kv_path_reason


@pytest.mark.parametrize("fa", ["on", "auto"])
def test_a_backend_whose_probe_declines_gets_the_dense_path(numpy_model, monkeypatch, fa):
    monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    assert not numpy_model.backend.supports(op("attention_rows", n_head=4, n_head_kv=2))
    ctx = Context(numpy_model, ContextParams(n_ctx=32, flash_attn=fa))
    assert ctx.kv_path == "dense"
    assert ctx.kv_path_reason == "backend numpy does not support attention_rows"


def test_the_probe_gets_the_models_attention_parameters(torch_model):
    seen = []

    class Spy:
        name, dtype = "spy", "bf16"

        def supports(self, op):
            seen.append((op.name, dict(op.params), op.dtype))
            return False

    attention = dict(torch_model.arch.required_ops(torch_model.config))["attention"]
    path, _ = choose_kv_path(None, ContextParams(), Spy(), attention)
    assert path == "dense"
    assert seen == [("attention_rows", {"n_head": 4, "n_head_kv": 2, "head_dim": 16}, "bf16")]


def test_flash_attn_value_is_checked():
    with pytest.raises(TesseraError, match="flash_attn must be one of on, off, auto"):
        ContextParams(flash_attn="yes")


def test_context_creation_logs_the_path(torch_model, monkeypatch, caplog):
    monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    with caplog.at_level(logging.INFO, logger="tessera.engine.context"):
        Context(torch_model, ContextParams(n_ctx=32, flash_attn="on"))
    assert "kv path: rows (unified, -fa on, backend torch supports attention_rows)" in caplog.text


def test_each_path_calls_only_its_own_op(torch_model, monkeypatch):
    backend = torch_model.backend
    batch = Batch.for_sequence([5, 6, 7], logits="last")

    def refuse(*args, **kwargs):
        raise AssertionError("the other path's op was called")

    monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    with monkeypatch.context() as m:
        m.setattr(backend, "attention", refuse)
        Context(torch_model, ContextParams(n_ctx=16, flash_attn="on")).decode(batch)
    with monkeypatch.context() as m:
        m.setattr(backend, "attention_rows", refuse)
        Context(torch_model, ContextParams(n_ctx=16, flash_attn="off")).decode(batch)


# -- generation -----------------------------------------------------------------------


def _generate_parallel(model, path_env, monkeypatch, n_steps=6):
    """Greedy generation of 4 sequences with ragged prompts, all in one batch per step."""
    if path_env:
        monkeypatch.setenv("TESSERA_KV_ROWS_DISABLE", "1")
    else:
        monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    ctx = Context(model, ContextParams(n_ctx=96, n_seq_max=4, n_ubatch=7, flash_attn="on"))
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, model.n_vocab, n) for n in (9, 3, 14, 6)]
    logits = ctx.decode(
        Batch.concat([Batch.for_sequence(p, 0, s, "last") for s, p in enumerate(prompts)])
    )
    tokens, all_logits = [], [logits]
    lengths = np.array([len(p) for p in prompts])
    for step in range(n_steps):
        nxt = logits.argmax(-1)
        tokens.append(nxt)
        logits = ctx.decode(Batch(nxt, lengths + step, np.arange(4), np.ones(4, dtype=bool)))
        all_logits.append(logits)
    return ctx.kv_path, np.array(tokens), np.concatenate(all_logits)


def test_four_parallel_sequences_generate_the_same_tokens_on_both_paths(
    torch_model, numpy_model, monkeypatch
):
    path_rows, tokens_rows, logits_rows = _generate_parallel(torch_model, False, monkeypatch)
    path_dense, tokens_dense, logits_dense = _generate_parallel(torch_model, True, monkeypatch)
    path_ref, tokens_ref, logits_ref = _generate_parallel(numpy_model, False, monkeypatch)
    assert (path_rows, path_dense, path_ref) == ("rows", "dense", "dense")
    np.testing.assert_array_equal(tokens_rows, tokens_dense)
    np.testing.assert_array_equal(tokens_rows, tokens_ref)
    np.testing.assert_allclose(logits_rows, logits_dense, atol=1e-4)
    np.testing.assert_allclose(logits_rows, logits_ref, atol=1e-4)

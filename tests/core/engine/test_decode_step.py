"""The KV bookkeeping of a decode step: the same cells and row lists as the general path,
built in arrays made once per context, so a step allocates nothing that grows with the
context or the history."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.kv_cache import KVCache
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf

N_CTX = 48


def _reference_rows(kv: KVCache, p: int, seq: int, window: int) -> np.ndarray:
    """The cells a query of ``seq`` at ``p`` sees, by (position, cell): the oracle."""
    cells = [
        c
        for c in range(N_CTX)
        if kv.seqs[c] & np.uint64(1 << seq)
        and kv.pos[c] <= p
        and (window == 0 or kv.pos[c] > p - window)
    ]
    return np.array(sorted(cells, key=lambda c: (kv.pos[c], c)), dtype=np.int64)


# One operation on the cache: append tokens to a sequence, remove a range, copy, keep one.
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(1, 5)),
        st.tuples(st.just("rm"), st.integers(-1, 2), st.integers(0, 20)),
        st.tuples(st.just("cp"), st.integers(0, 2), st.integers(0, 2)),
        st.tuples(st.just("keep"), st.integers(0, 2), st.just(0)),
    ),
    max_size=25,
)


def _apply(kv: KVCache, ops: list[tuple[str, int, int]]) -> None:
    for op, a, b in ops:
        if op == "add":
            start = kv.seq_pos_max(a) + 1
            n = min(b, N_CTX - kv.n_used)
            if n <= 0:
                continue
            cells = kv.find_slot(n, np.full(n, a))
            kv.commit(cells, np.arange(start, start + n), np.full(n, a))
        elif op == "rm":
            kv.seq_rm(a, b)
        elif op == "cp":
            kv.seq_cp(a, b)
        else:
            kv.seq_keep(a)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, window=st.sampled_from([0, 3]))
def test_one_query_rows_and_cells_match_the_general_path(ops, window):
    kv = KVCache(None, [None], N_CTX, n_seq_max=3)
    _apply(kv, ops)
    used = np.flatnonzero(kv.seqs)
    assert kv.n_kv() == (int(used[-1]) + 1 if len(used) else 0)
    if kv.n_used < N_CTX:
        free = int(np.flatnonzero(kv.seqs == 0)[0])
        assert kv.find_slot(1)[0] == free  # the lowest free cell, as the general search
    for seq in range(3):
        p = kv.seq_pos_max(seq) + 1
        got = kv.rows(np.array([p]), np.array([seq]), kv.n_kv(), window)
        want = _reference_rows(kv, p, seq, window)
        if len(want) == 0:
            assert (got.rows < 0).all()
            continue
        np.testing.assert_array_equal(got.rows[0][got.rows[0] >= 0], want)
        np.testing.assert_array_equal(got.pos[0][: len(want)], kv.pos[want])
        assert got.allowed().all() and not got.padded


def test_two_windows_in_one_step_keep_their_own_row_lists():
    """A gemma-style step asks for the global and the sliding-window rows of one token."""
    kv = KVCache(None, [None], N_CTX)
    kv.commit(np.arange(10), np.arange(10), np.zeros(10, dtype=np.int64))
    full = kv.rows(np.array([9]), np.array([0]), kv.n_kv(), 0)
    local = kv.rows(np.array([9]), np.array([0]), kv.n_kv(), 4)
    np.testing.assert_array_equal(full.rows[0], np.arange(10))
    np.testing.assert_array_equal(local.rows[0], np.arange(6, 10))


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    path = make_gguf(tmp_path_factory.mktemp("decode") / "qwen2.gguf", "qwen2", qtype="q8_0")
    return load_model(path, Runtime(), "torch")


def _step_bytes(model, n_ctx: int, n_history: int) -> int:
    """Median bytes a decode step allocates and frees again (numpy data and Python objects,
    as tracemalloc sees them), after ``n_history`` tokens."""
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=512))
    ctx.decode(Batch.for_sequence([1 + t % 50 for t in range(n_history)], 0, 0, "last"))
    pos = n_history
    for _ in range(3):  # warm: per-context buffers and caches made on first use
        ctx.decode(Batch([5], [pos], [0], [True]))
        pos += 1
    tracemalloc.start()
    try:
        samples = []
        for _ in range(9):
            batch = Batch([5], [pos], [0], [True])
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            ctx.decode(batch)
            samples.append(tracemalloc.get_traced_memory()[1] - before)
            pos += 1
    finally:
        tracemalloc.stop()
    return int(np.median(samples))


def test_a_decode_step_allocates_nothing_that_grows_with_the_context(qwen2):
    small, large = _step_bytes(qwen2, 512, 32), _step_bytes(qwen2, 16384, 32)
    # 16384 cells of per-cell bookkeeping would be >= 16 KiB per step
    assert large - small < 4096, (small, large)


def test_a_decode_step_allocates_nothing_that_grows_with_the_history(qwen2):
    short, long = _step_bytes(qwen2, 4096, 16), _step_bytes(qwen2, 4096, 480)
    assert long - short < 4096, (short, long)

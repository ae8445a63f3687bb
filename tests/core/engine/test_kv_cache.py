"""The unified KV cache: slots, masks and sequence operations."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.arch import KVLayerLayout
from tessera.engine.kv_cache import KVCache
from tessera.errors import ContextOverflowError


def make_cache(n_ctx=8, n_seq_max=4, n_layer=2):
    return KVCache(NumpyBackend(), [KVLayerLayout(2, 4, 3)] * n_layer, n_ctx, n_seq_max)


def fill(cache, positions, seq_id):
    cells = cache.find_slot(len(positions))
    cache.commit(cells, np.asarray(positions), np.full(len(positions), seq_id))
    return cells


def test_tensors_are_preallocated_per_layer_with_layout_shapes():
    cache = KVCache(NumpyBackend(), [KVLayerLayout(2, 4, 3), None], 16)
    assert cache.k[0].shape == (16, 2, 4) and cache.v[0].shape == (16, 2, 3)
    assert cache.k[1] is None and cache.v[1] is None


def test_find_slot_prefers_a_contiguous_run_then_any_free_cells():
    cache = make_cache(n_ctx=8)
    assert fill(cache, [0, 1, 2], 0).tolist() == [0, 1, 2]
    assert fill(cache, [0, 1], 1).tolist() == [3, 4]
    cache.seq_rm(0, 1, 2)  # frees cell 1
    assert cache.find_slot(3).tolist() == [5, 6, 7]
    fill(cache, [0, 1, 2], 2)
    assert cache.find_slot(1).tolist() == [1]
    with pytest.raises(ContextOverflowError, match="only 1 of 8 are free"):
        cache.find_slot(2)


def test_mask_is_causal_and_keeps_sequences_apart():
    cache = make_cache()
    fill(cache, [0, 1, 2], 0)
    fill(cache, [0, 1], 1)
    mask = cache.mask(np.array([1, 2, 1]), np.array([0, 0, 1]), cache.n_kv())
    expected = np.array(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(mask, expected)


def test_seq_cp_shares_cells_and_seq_rm_removes_a_range():
    cache = make_cache()
    fill(cache, [0, 1, 2, 3], 0)
    cache.seq_cp(0, 2, 0, 2)
    assert cache.seq_pos_max(2) == 1
    mask = cache.mask(np.array([5]), np.array([2]), cache.n_kv())
    assert mask.tolist() == [[True, True, False, False]]
    cache.seq_rm(0, 2)
    assert cache.seq_pos_max(0) == 1
    assert cache.n_used == 2  # cells 0-1 still seen by seq 0 and 2
    cache.seq_rm(0)
    assert cache.n_used == 2 and cache.seq_pos_max(0) == -1  # seq 2 keeps them
    cache.seq_keep(1)
    assert cache.n_used == 0 and cache.n_kv() == 0


def test_n_seq_max_is_bounded():
    with pytest.raises(ValueError, match="n_seq_max"):
        make_cache(n_seq_max=65)

"""Batches and their ubatch split."""

import numpy as np
import pytest

from tessera.engine.batch import Batch


def test_for_sequence_positions_and_output_flags():
    b = Batch.for_sequence([5, 6, 7], start_pos=10, seq_id=2, logits="last")
    assert b.positions.tolist() == [10, 11, 12]
    assert b.seq_ids.tolist() == [2, 2, 2]
    assert b.output.tolist() == [False, False, True]
    assert Batch.for_sequence([1, 2], logits="all").n_outputs == 2
    assert Batch.for_sequence([1, 2], logits="none").n_outputs == 0


def test_split_covers_every_row_once_in_order():
    b = Batch.concat([Batch.for_sequence(range(5), 0, 0), Batch.for_sequence(range(4), 0, 1)])
    parts = list(b.split(4))
    assert [len(p) for p in parts] == [4, 4, 1]
    np.testing.assert_array_equal(np.concatenate([p.seq_ids for p in parts]), b.seq_ids)
    np.testing.assert_array_equal(np.concatenate([p.output for p in parts]), b.output)


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="same length"):
        Batch([1, 2], [0], [0, 0], [True, True])

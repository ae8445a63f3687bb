"""Rolling a verified draft's rejected rows out of a context, recurrent states included.

A draft is verified by evaluating ``[last token, d_1 .. d_k]`` in one batch; the rows past
the ones kept must then leave the context. The KV cache drops them by position. A
recurrent state (:mod:`tessera.engine.recurrent`) has folded every row in and cannot be
cut back, so :func:`checkpoint` saves the drafting sequences' states before the batch, and
:func:`keep_rows` restores them and evaluates the kept rows again: each state then holds
exactly the kept rows, as plain decoding would have left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tessera.engine.batch import Batch


@attrs.frozen
class KeptRows:
    """Of the rows ``tokens`` a verify batch evaluated for ``seq_id`` from ``start_pos``,
    the first ``n_keep`` stay in the context."""

    seq_id: int
    tokens: Sequence[int]
    start_pos: int
    n_keep: int


def checkpoint(ctx: Any, seq_ids: Sequence[int]) -> dict[int, Any]:
    """The recurrent states of ``seq_ids`` before a batch that carries their drafts (empty
    for a context without recurrent layers: its KV cache alone rolls back)."""
    rec = getattr(ctx, "recurrent", None)
    if rec is None:
        return {}
    return {s: rec.snapshot(np.array([s], dtype=np.int64)) for s in seq_ids}


def keep_rows(ctx: Any, saved: dict[int, Any], kept: Sequence[KeptRows]) -> int:
    """Leave only each sequence's kept rows of the verify batch in ``ctx``; the number of
    rows evaluated again (one batch for all sequences whose state had to be restored)."""
    again = []
    for k in kept:
        if ctx.kv.seq_rm(k.seq_id, k.start_pos + k.n_keep):
            continue  # nothing past the kept rows, or a KV cache alone: cut by position
        # the state folded in rejected rows: back to before the batch, then the kept rows
        ctx.recurrent.restore(saved[k.seq_id])
        ctx.kv.seq_rm(k.seq_id, k.start_pos)
        again.append(Batch.for_sequence(k.tokens[: k.n_keep], k.start_pos, k.seq_id, "none"))
    if again:
        ctx.decode(Batch.concat(again))
    return sum(len(b) for b in again)

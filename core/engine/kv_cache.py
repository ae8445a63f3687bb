"""The unified KV cache: one preallocated K and V tensor per layer, shared by all sequences.

Each of the ``n_ctx`` cells holds one token's K/V rows. Cell metadata (position and the set
of sequences that see the cell) lives in numpy arrays, so finding free cells, building the
attention mask and removing or copying sequences are vectorized and never touch the
tensors. Tensors are written in place by the backend's ``set_rows``.

Attention reads the cache on one of two paths (chosen per context, see
:func:`tessera.engine.context.choose_kv_path`): a dense mask over cells ``[0, n_kv)``, or per
sequence the list of cells it really attends to (:class:`KVRows`, the ``attention_rows``
op), so each sequence pays for its own history only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.contract.arch import KVLayerLayout
from tessera.engine.kv_view import KVRows, KVView
from tessera.errors import ContextOverflowError

MAX_SEQUENCES = 64  # sequence sets are stored as one uint64 bit mask per cell

#: ``q_rows`` of one query in one slice (and ``[0]``, its ``q_index``), shared, read-only.
_ONE_QUERY = np.zeros((1, 1), dtype=np.int64)
_ONE_QUERY.flags.writeable = False


class KVCache:
    """Cells with position + sequence ids over per-layer K/V tensors allocated once."""

    def __init__(
        self,
        backend: Any,
        layout: Sequence[KVLayerLayout | None],
        n_ctx: int,
        n_seq_max: int = 1,
        unified: bool = True,
        type_k: str = "",
        type_v: str = "",
    ) -> None:
        if not 1 <= n_seq_max <= MAX_SEQUENCES:
            raise ValueError(f"n_seq_max must be between 1 and {MAX_SEQUENCES}, got {n_seq_max}")
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        #: True: any sequence may use any cell. False (llama.cpp's split streams): sequence
        #: ``s`` writes only cells ``[s * n_ctx_seq, (s + 1) * n_ctx_seq)``.
        self.unified = unified
        self.n_ctx_seq = n_ctx if unified else n_ctx // n_seq_max
        #: The stored types of K and V (``-ctk`` / ``-ctv``; "": the compute dtype).
        self.type_k, self.type_v = type_k, type_v
        self.k = [
            None if L is None else _cache(backend, (n_ctx, L.n_head_kv, L.head_dim_k), type_k)
            for L in layout
        ]
        self.v = [
            _v_cache(backend, L, k, n_ctx, type_v) for L, k in zip(layout, self.k, strict=True)
        ]
        self.pos = np.full(n_ctx, -1, dtype=np.int32)
        self.seqs = np.zeros(n_ctx, dtype=np.uint64)
        # What a decode step needs, made once: it then allocates nothing that grows with
        # the context or the history (see find_slot and rows).
        self._n_kv = 0
        self._first_free = 0  # every cell below it is used
        self._cell_ids = np.arange(n_ctx, dtype=np.int64)
        self._cell_ids.flags.writeable = False
        self._bits = np.empty(n_ctx, dtype=np.uint64)
        self._seen = np.empty(n_ctx, dtype=np.bool_)
        self._test = np.empty(n_ctx, dtype=np.bool_)
        self._row_lists: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # by window

    # -- cells -----------------------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seqs))

    def n_kv(self) -> int:
        """One past the highest used cell: attention never needs to look further."""
        return self._n_kv

    def _cells_changed(self) -> None:
        """Recount after cells were freed or rewritten (sequence operations, restores): the
        lowest free cell exactly, so the next decode token's search does not walk the
        cells below it in Python (speculative steps free cells every step)."""
        used = self.seqs != 0
        self._first_free = int(np.argmin(used)) if not used.all() else self.n_ctx
        self._n_kv = self.n_ctx - int(np.argmax(used[::-1])) if used.any() else 0

    def find_slot(self, n_tokens: int, seq_ids: np.ndarray | None = None) -> np.ndarray:
        """Cells for ``n_tokens`` new tokens: the first free run that fits, else any free cells.

        A split (non-unified) cache places each sequence's tokens in its own stream, so it
        needs ``seq_ids``.
        """
        if self.unified or seq_ids is None:
            if n_tokens == 1:  # a decode step: the lowest free cell, found in place
                cell = self._first_free
                while cell < self.n_ctx and self.seqs[cell] != 0:
                    cell += 1
                self._first_free = cell
                if cell < self.n_ctx:
                    return self._cell_ids[cell : cell + 1]
            return self._free_cells(n_tokens, 0, self.n_ctx)
        seq_ids = np.asarray(seq_ids)
        cells = np.empty(len(seq_ids), dtype=np.int64)
        for s in np.unique(seq_ids):  # per sequence, not per token
            at = seq_ids == s
            lo = int(s) * self.n_ctx_seq
            cells[at] = self._free_cells(int(at.sum()), lo, lo + self.n_ctx_seq)
        return cells

    def _free_cells(self, n_tokens: int, lo: int, hi: int) -> np.ndarray:
        free = self.seqs[lo:hi] == 0
        if n_tokens <= 0:
            return np.zeros(0, dtype=np.int64)
        # A contiguous run keeps n_kv small and the writes sequential.
        free_before = np.concatenate(([0], np.cumsum(free)))
        starts = np.flatnonzero(free_before[n_tokens:] - free_before[:-n_tokens] == n_tokens)
        if len(starts):
            return np.arange(lo + starts[0], lo + starts[0] + n_tokens)
        cells = np.flatnonzero(free)
        if len(cells) < n_tokens:
            raise ContextOverflowError(
                f"the KV cache is full: {n_tokens} new tokens need cells but only {len(cells)} "
                f"of {hi - lo} are free; raise the context size (-c) or end some sequences"
            )
        return lo + cells[:n_tokens]

    def commit(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Mark ``cells`` as holding tokens at ``positions`` of sequences ``seq_ids``."""
        self.pos[cells] = positions
        self.seqs[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        if len(cells):
            self._n_kv = max(self._n_kv, int(cells.max()) + 1)

    def release(self, cells: np.ndarray) -> None:
        self.pos[cells] = -1
        self.seqs[cells] = 0
        self._cells_changed()

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """The cells' metadata (positions, sequence sets), for :meth:`restore`."""
        return self.pos.copy(), self.seqs.copy()

    def restore(self, snapshot: tuple[np.ndarray, np.ndarray]) -> None:
        """Put back the metadata of a :meth:`snapshot` (the tensors are not touched)."""
        self.pos[:], self.seqs[:] = snapshot
        self._cells_changed()

    def mask(
        self, positions: np.ndarray, seq_ids: np.ndarray, n_kv: int, window: int = 0
    ) -> np.ndarray:
        """Causal mask (T, n_kv): a query sees cells of its sequence at positions <= its own.

        With ``window > 0`` (sliding window, n_swa) only cells with ``pos > p - window``.
        """
        bits = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))[:, None]
        same_seq = (self.seqs[None, :n_kv] & bits) != 0
        seen = same_seq & (self.pos[None, :n_kv] <= positions[:, None])
        if window > 0:
            seen &= self.pos[None, :n_kv] > positions[:, None] - window
        return seen

    def rows(
        self, positions: np.ndarray, seq_ids: np.ndarray, n_kv: int, window: int = 0
    ) -> KVRows:
        """Row lists (:class:`KVRows`): one slice per sequence, its cells in position order.

        Vectorized over sequences and cells; a slice keeps only the cells some query of
        it may see (positions up to its last query, inside the window of its first).
        """
        if len(seq_ids) == 1:
            one = self._one_query_rows(int(positions[0]), int(seq_ids[0]), n_kv, window)
            if one is not None:
                return one
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int32)
        slice_seqs, q_slice = np.unique(seq_ids, return_inverse=True)
        q_order = np.argsort(q_slice, kind="stable")
        q_counts = np.bincount(q_slice, minlength=len(slice_seqs))
        q_rank = np.arange(len(seq_ids)) - np.repeat(np.cumsum(q_counts) - q_counts, q_counts)
        q_rows = np.full((len(slice_seqs), q_counts.max()), -1, dtype=np.int64)
        q_rows[q_slice[q_order], q_rank] = q_order
        q_pos = np.where(q_rows >= 0, positions[q_rows], -1).astype(np.int32)
        q_index = np.empty(len(seq_ids), dtype=np.int64)
        q_index[q_order] = q_slice[q_order] * q_rows.shape[1] + q_rank

        bits = np.left_shift(np.uint64(1), slice_seqs.astype(np.uint64))[:, None]
        cell_pos = self.pos[None, :n_kv]
        seen = ((self.seqs[None, :n_kv] & bits) != 0) & (cell_pos <= q_pos.max(1)[:, None])
        if window > 0:
            first = np.where(q_rows >= 0, q_pos, np.iinfo(np.int32).max).min(1)
            seen &= cell_pos > (first - window)[:, None]
        s_idx, cells = np.nonzero(seen)
        order = np.lexsort((self.pos[cells], s_idx))  # causal order inside each slice
        s_idx, cells = s_idx[order], cells[order]
        counts = np.bincount(s_idx, minlength=len(slice_seqs))
        rank = np.arange(len(cells)) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = np.full((len(slice_seqs), max(int(counts.max(initial=0)), 1)), -1, dtype=np.int64)
        rows[s_idx, rank] = cells
        pos = np.where(rows >= 0, self.pos[rows], -1).astype(np.int32)
        return KVRows(q_rows, q_pos, rows, pos, q_index, window)

    def _one_query_rows(self, p: int, seq: int, n_kv: int, window: int) -> KVRows | None:
        """:meth:`rows` of one query (a decode step), built in arrays made once per context
        and window: the cells of ``seq`` it sees, in position order. None when they are not
        in position order already (cells reused out of order) or there are none: the
        general path sorts them."""
        bits, seen, test = self._bits[:n_kv], self._seen[:n_kv], self._test[:n_kv]
        np.bitwise_and(self.seqs[:n_kv], np.uint64(1 << seq), out=bits)
        np.not_equal(bits, 0, out=seen)
        np.less_equal(self.pos[:n_kv], p, out=test)
        np.logical_and(seen, test, out=seen)
        if window > 0:
            np.greater(self.pos[:n_kv], p - window, out=test)
            np.logical_and(seen, test, out=seen)
        count = int(np.count_nonzero(seen))
        if count == 0:
            return None
        if window not in self._row_lists:  # one pair per window: a gemma step uses two
            self._row_lists[window] = (
                np.empty((1, self.n_ctx), dtype=np.int64),
                np.empty((1, self.n_ctx), dtype=np.int32),
            )
        rows, pos = (a[:, :count] for a in self._row_lists[window])
        np.compress(seen, self._cell_ids[:n_kv], out=rows[0])
        np.take(self.pos, rows[0], out=pos[0])
        if count > 1 and np.greater(pos[0, :-1], pos[0, 1:], out=test[: count - 1]).any():
            return None
        q_pos = np.full((1, 1), p, dtype=np.int32)
        return KVRows(_ONE_QUERY, q_pos, rows, pos, _ONE_QUERY[0], window, all_allowed=True)

    def view(
        self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, path: str = "dense"
    ) -> KVView:
        return KVView(self.k, self.v, cells, self.n_kv(), positions, seq_ids, self, path)

    # -- sequences (llama.cpp's seq_rm / seq_cp / seq_keep) --------------------------

    def _range(self, p0: int, p1: int | None) -> np.ndarray:
        hi = np.iinfo(np.int32).max if p1 is None or p1 < 0 else p1
        return (self.pos >= max(p0, 0)) & (self.pos < hi)

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> bool:
        """Remove positions [p0, p1) of ``seq_id`` (all sequences when seq_id < 0); True.
        (A cache with recurrent states answers False for a range it cannot remove.)"""
        in_range = self._range(p0, p1)
        if seq_id < 0:
            self.seqs[in_range] = 0
        else:
            self.seqs[in_range] &= ~np.uint64(1 << seq_id)
        self.pos[self.seqs == 0] = -1
        self._cells_changed()
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> bool:
        """Let ``dst`` see the cells of ``src`` in [p0, p1) without copying any tensor; True."""
        sel = self._range(p0, p1) & ((self.seqs & np.uint64(1 << src)) != 0)
        self.seqs[sel] |= np.uint64(1 << dst)
        return True

    def seq_keep(self, seq_id: int) -> None:
        self.seqs &= np.uint64(1 << seq_id)
        self.pos[self.seqs == 0] = -1
        self._cells_changed()

    def seq_pos_max(self, seq_id: int) -> int:
        """Highest position of ``seq_id`` in the cache, -1 if it has none."""
        sel = (self.seqs & np.uint64(1 << seq_id)) != 0
        return int(self.pos[sel].max()) if sel.any() else -1

    def clear(self) -> None:
        self.pos[:] = -1
        self.seqs[:] = 0
        self._cells_changed()


def _cache(backend: Any, shape: tuple[int, int, int], cache_type: str) -> Any:
    """A zero-filled cache tensor: the compute dtype, or the backend's ``kv_cache`` of a type."""
    if not cache_type or cache_type == backend.dtype:
        return backend.zeros(shape)
    return backend.kv_cache(shape, cache_type)


def _v_cache(
    backend: Any, layout: KVLayerLayout | None, k: Any, n_ctx: int, cache_type: str = ""
) -> Any:
    """A layer's V tensor: its own, or a view of its K rows' first values (``v_in_k``)."""
    if layout is None:
        return None
    if layout.v_in_k:
        return k[:, :, : layout.head_dim_v]
    return _cache(backend, (n_ctx, layout.n_head_kv, layout.head_dim_v), cache_type)

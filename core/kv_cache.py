"""The unified KV cache: one preallocated K and V tensor per layer, shared by all sequences.

Each of the ``n_ctx`` cells holds one token's K/V rows. Cell metadata (position and the set
of sequences that see the cell) lives in numpy arrays, so finding free cells, building the
attention mask and removing or copying sequences are vectorized and never touch the
tensors. Tensors are written in place by the backend's ``set_rows``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tessera.arch import KVLayerLayout
from tessera.errors import ContextOverflowError

MAX_SEQUENCES = 64  # sequence sets are stored as one uint64 bit mask per cell


@attrs.frozen
class KVView:
    """What one ubatch's forward pass sees of the cache (see :class:`ForwardInput`)."""

    k: Sequence[Any]
    v: Sequence[Any]
    cells: np.ndarray  # where this ubatch's tokens are written, (T,)
    n_kv: int  # attention covers cells [0, n_kv)
    mask: np.ndarray  # (T, n_kv) bool, True where the query may attend


class KVCache:
    """Cells with position + sequence ids over per-layer K/V tensors allocated once."""

    def __init__(
        self, backend: Any, layout: Sequence[KVLayerLayout | None], n_ctx: int, n_seq_max: int = 1
    ) -> None:
        if not 1 <= n_seq_max <= MAX_SEQUENCES:
            raise ValueError(f"n_seq_max must be between 1 and {MAX_SEQUENCES}, got {n_seq_max}")
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.k = [
            None if L is None else backend.zeros((n_ctx, L.n_head_kv, L.head_dim_k)) for L in layout
        ]
        self.v = [
            None if L is None else backend.zeros((n_ctx, L.n_head_kv, L.head_dim_v)) for L in layout
        ]
        self.pos = np.full(n_ctx, -1, dtype=np.int32)
        self.seqs = np.zeros(n_ctx, dtype=np.uint64)

    # -- cells -----------------------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seqs))

    def n_kv(self) -> int:
        """One past the highest used cell: attention never needs to look further."""
        used = np.flatnonzero(self.seqs)
        return int(used[-1]) + 1 if len(used) else 0

    def find_slot(self, n_tokens: int) -> np.ndarray:
        """Cells for ``n_tokens`` new tokens: the first free run that fits, else any free cells."""
        free = self.seqs == 0
        if n_tokens <= 0:
            return np.zeros(0, dtype=np.int64)
        # A contiguous run keeps n_kv small and the writes sequential.
        free_before = np.concatenate(([0], np.cumsum(free)))
        starts = np.flatnonzero(free_before[n_tokens:] - free_before[:-n_tokens] == n_tokens)
        if len(starts):
            return np.arange(starts[0], starts[0] + n_tokens)
        cells = np.flatnonzero(free)
        if len(cells) < n_tokens:
            raise ContextOverflowError(
                f"the KV cache is full: {n_tokens} new tokens need cells but only {len(cells)} "
                f"of {self.n_ctx} are free; raise the context size (-c) or end some sequences"
            )
        return cells[:n_tokens]

    def commit(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Mark ``cells`` as holding tokens at ``positions`` of sequences ``seq_ids``."""
        self.pos[cells] = positions
        self.seqs[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))

    def release(self, cells: np.ndarray) -> None:
        self.pos[cells] = -1
        self.seqs[cells] = 0

    def mask(self, positions: np.ndarray, seq_ids: np.ndarray, n_kv: int) -> np.ndarray:
        """Causal mask (T, n_kv): a query sees cells of its sequence at positions <= its own."""
        bits = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))[:, None]
        same_seq = (self.seqs[None, :n_kv] & bits) != 0
        return same_seq & (self.pos[None, :n_kv] <= positions[:, None])

    def view(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> KVView:
        n_kv = self.n_kv()
        return KVView(self.k, self.v, cells, n_kv, self.mask(positions, seq_ids, n_kv))

    # -- sequences (llama.cpp's seq_rm / seq_cp / seq_keep) --------------------------

    def _range(self, p0: int, p1: int | None) -> np.ndarray:
        hi = np.iinfo(np.int32).max if p1 is None or p1 < 0 else p1
        return (self.pos >= max(p0, 0)) & (self.pos < hi)

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """Remove positions [p0, p1) of ``seq_id`` (all sequences when seq_id < 0)."""
        in_range = self._range(p0, p1)
        if seq_id < 0:
            self.seqs[in_range] = 0
        else:
            self.seqs[in_range] &= ~np.uint64(1 << seq_id)
        self.pos[self.seqs == 0] = -1

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> None:
        """Let ``dst`` see the cells of ``src`` in [p0, p1) without copying any tensor."""
        sel = self._range(p0, p1) & ((self.seqs & np.uint64(1 << src)) != 0)
        self.seqs[sel] |= np.uint64(1 << dst)

    def seq_keep(self, seq_id: int) -> None:
        self.seqs &= np.uint64(1 << seq_id)
        self.pos[self.seqs == 0] = -1

    def seq_pos_max(self, seq_id: int) -> int:
        """Highest position of ``seq_id`` in the cache, -1 if it has none."""
        sel = (self.seqs & np.uint64(1 << seq_id)) != 0
        return int(self.pos[sel].max()) if sel.any() else -1

    def clear(self) -> None:
        self.pos[:] = -1
        self.seqs[:] = 0

"""What one ubatch's forward pass sees of the KV cache: a view of the cells, and the row
lists of the rows path (:class:`KVRows`, the ``attention_rows`` op).

The cache itself (cells, sequences, the tensors) is :class:`tessera.engine.kv_cache.KVCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:
    from tessera.engine.kv_cache import KVCache


@attrs.frozen
class KVRows:
    """Row lists of the rows path (backend op ``attention_rows``) for one ubatch.

    The ubatch's queries are grouped into ``S`` slices, one per sequence. Slice ``s``
    attends to the cache cells ``rows[s]`` (that sequence's cells, ordered by position)
    and nothing else; a negative entry is padding and must act exactly like a ``-inf``
    mask entry. Inside a slice, query ``j`` at position ``q_pos[s, j]`` sees row ``r``
    only when ``pos[s, r] <= q_pos[s, j]`` (causal order) and, with ``window > 0``,
    ``pos[s, r] > q_pos[s, j] - window`` (sliding window).
    """

    q_rows: np.ndarray  # (S, Tq) int64: ubatch row of each query, -1 = padding
    q_pos: np.ndarray  # (S, Tq) int32: position of each query
    rows: np.ndarray  # (S, R) int64: cache cells, -1 = padding
    pos: np.ndarray  # (S, R) int32: position held by each cell
    q_index: np.ndarray  # (T,) int64: where ubatch row t sits in q_rows.ravel()
    window: int = 0  # n_swa; 0 = no sliding window
    #: Known when built: every query attends to every row, with no padding (one decode
    #: token over its sequence's visible cells).
    all_allowed: bool = False

    @property
    def padded(self) -> bool:
        """Whether any row list has padding (a backend may skip masking work without)."""
        return not self.all_allowed and bool((self.rows < 0).any())

    def allowed(self) -> np.ndarray:
        """(S, Tq, R) bool: which rows each query attends to (padding never)."""
        if self.all_allowed:  # a read-only view, no (S, Tq, R) array made
            return np.broadcast_to(np.True_, (*self.q_rows.shape, self.rows.shape[1]))
        seen = (self.rows >= 0)[:, None, :] & (self.pos[:, None, :] <= self.q_pos[:, :, None])
        if self.window > 0:
            seen &= self.pos[:, None, :] > self.q_pos[:, :, None] - self.window
        return seen & (self.q_rows >= 0)[:, :, None]


@attrs.define
class KVView:
    """What one ubatch's forward pass sees of the cache (see :class:`ForwardInput`).

    ``path`` says how attention runs: ``"dense"`` (a mask over cells ``[0, n_kv)``) or
    ``"rows"`` (row lists per sequence, :class:`KVRows`). Masks and row lists are built
    on first use, once per ubatch and window, so architectures only call :meth:`attend`.
    """

    k: Sequence[Any]
    v: Sequence[Any]
    cells: np.ndarray  # where this ubatch's tokens are written, (T,)
    n_kv: int  # attention covers cells [0, n_kv)
    positions: np.ndarray  # (T,) query positions
    seq_ids: np.ndarray  # (T,) query sequences
    cache: KVCache = attrs.field(repr=False)
    path: str = "dense"
    _built: dict[tuple[str, int], Any] = attrs.field(factory=dict, repr=False)

    def mask_for(self, window: int = 0) -> np.ndarray:
        """Dense (T, n_kv) bool mask, True where the query may attend."""
        key = ("mask", window)
        if key not in self._built:
            self._built[key] = self.cache.mask(self.positions, self.seq_ids, self.n_kv, window)
        return self._built[key]

    @property
    def mask(self) -> np.ndarray:
        return self.mask_for(0)

    def rows_for(self, window: int = 0) -> KVRows:
        key = ("rows", window)
        if key not in self._built:
            self._built[key] = self.cache.rows(self.positions, self.seq_ids, self.n_kv, window)
        return self._built[key]

    def attend(
        self,
        backend: Any,
        il: int,
        q: Any,
        scale: float,
        window: int = 0,
        softcap: float = 0.0,
        sinks: Any = None,
    ) -> Any:
        """Attention of ``q`` (T, Hq, D) over layer ``il``'s cache on this view's path.

        With ``softcap > 0`` the scores are capped, with ``sinks`` (a backend array of one
        logit per query head) each softmax has one more term (backend op
        ``attention_softcap``, which the architecture lists in its ``required_ops``); that
        op has a dense mask only, so capped attention and sinks take it on either path.
        """
        if softcap or sinks is not None:
            mask = self.mask_for(window)
            args = (q, self.k[il], self.v[il], self.n_kv, mask, scale, softcap)
            if sinks is None:  # a backend's op may predate sinks: pass them only when given
                return backend.attention_softcap(*args)
            return backend.attention_softcap(*args, sinks=sinks)
        if self.path == "rows":
            return backend.attention_rows(q, self.k[il], self.v[il], self.rows_for(window), scale)
        return backend.attention(q, self.k[il], self.v[il], self.n_kv, self.mask_for(window), scale)

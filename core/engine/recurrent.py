"""The per-sequence state of recurrent layers, kept beside the KV cache (llama.cpp's
recurrent memory inside its hybrid memory).

A recurrent layer (a gated delta net, a state-space block) folds a sequence's whole history
into a fixed-size state: a short conv's last inputs and a memory matrix, one of each per
sequence and layer (:class:`tessera.contract.arch.RecurrentLayerLayout`). The context
allocates them once and owns them; the architecture reads and writes them through a
:class:`RecurrentView` per ubatch.

A state holds no positions, so it cannot be cut back: :class:`HybridCache` (the KV cache
of a model with recurrent layers) removes or copies a sequence only as a whole, or a range
past its end, and refuses (returns False, nothing changed) a range that would cut into a
state. A ubatch must continue each sequence right after the position its state ends at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import RecurrentLayerLayout
from tessera.contract.ops import Op
from tessera.engine.kv_cache import KVCache, _cache
from tessera.errors import TesseraError


class RecurrentState:
    """Per recurrent layer a conv and a memory tensor of ``(n_seq_max, *shape)``, and per
    sequence the last position folded in (-1: empty)."""

    def __init__(
        self, backend: Any, layout: Sequence[RecurrentLayerLayout | None], n_seq_max: int
    ) -> None:
        self.backend = backend
        self.layout = list(layout)
        # float32 whatever the compute dtype, as llama.cpp keeps them: a memory carried
        # over a whole sequence should not be rounded to bf16 at every token
        f32 = backend.dtype == "f32" or backend.supports(Op("kv_cache", {"type": "f32"}))
        store = "f32" if f32 else ""

        def tensors(shape: tuple[int, ...]) -> Any:
            return _cache(backend, (n_seq_max, *shape), store)

        self.conv = [None if L is None else tensors(L.conv_shape) for L in layout]
        self.ssm = [None if L is None else tensors(L.state_shape) for L in layout]
        self.pos = np.full(n_seq_max, -1, dtype=np.int64)

    def tensors(self) -> list[Any]:
        """Every state tensor, layer by layer (conv, then memory): what a state file holds."""
        return [t for pair in zip(self.conv, self.ssm, strict=True) for t in pair if t is not None]

    def _seqs(self, seq_id: int) -> np.ndarray:
        return np.arange(len(self.pos)) if seq_id < 0 else np.array([seq_id])

    def zero(self, seqs: np.ndarray) -> None:
        for t in self.tensors():
            t[seqs] = 0  # numpy and torch alike
        self.pos[seqs] = -1

    def copy(self, src: int, dst: int) -> None:
        for t in self.tensors():
            self.backend.set_rows(t, np.array([dst]), t[np.array([src])])
        self.pos[dst] = self.pos[src]

    def snapshot(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[Any]]:
        """The states of ``seqs``, for :meth:`restore` (a failed decode puts them back)."""
        # advanced indexing copies, in numpy and torch alike
        return seqs, self.pos[seqs].copy(), [t[seqs] for t in self.tensors()]

    def restore(self, snapshot: tuple[np.ndarray, np.ndarray, list[Any]]) -> None:
        seqs, pos, values = snapshot
        for t, v in zip(self.tensors(), values, strict=True):
            self.backend.set_rows(t, seqs, v)
        self.pos[seqs] = pos

    def cut(self, seq_id: int, p0: int, p1: int | None) -> str:
        """What removing positions [p0, p1) does to the state of ``seq_id``: ``"none"``
        (the range misses it), ``"all"`` (it covers it) or ``"refused"`` (it cuts into it)."""
        hi = np.iinfo(np.int64).max if p1 is None or p1 < 0 else p1
        lo, kinds = max(p0, 0), set()
        for pos in self.pos[self._seqs(seq_id)]:
            if pos < 0 or lo > pos or hi <= lo:
                kinds.add("none")
            elif lo == 0 and hi > pos:
                kinds.add("all")
            else:
                return "refused"
        return "all" if "all" in kinds else "none"

    def view(self, seq_ids: np.ndarray, positions: np.ndarray) -> RecurrentView:
        """The ubatch's rows by sequence; each must continue its sequence's state."""
        groups = []
        for seq in np.unique(seq_ids):
            rows = np.flatnonzero(seq_ids == seq)
            start, end = int(self.pos[seq]) + 1, int(self.pos[seq]) + len(rows)
            if not np.array_equal(positions[rows], np.arange(start, end + 1)):
                raise TesseraError(
                    f"sequence {seq} continues at position {int(positions[rows][0])}, but its "
                    f"recurrent state ends at position {start - 1} and cannot be cut back or "
                    "skip ahead; remove the whole sequence and evaluate it from position 0"
                )
            groups.append((int(seq), rows))
            self.pos[seq] = end
        return RecurrentView(self, tuple(groups), len(seq_ids))


def recurrent_state(model: Any, n_seq_max: int) -> RecurrentState | None:
    """The states a context keeps for ``model``, None when it has no recurrent layer."""
    layout = model.arch.recurrent_layout(model.config)
    if not any(L is not None for L in layout):
        return None
    return RecurrentState(model.backend, layout, n_seq_max)


@attrs.frozen
class RecurrentView:
    """One ubatch's access to the states: its rows grouped by sequence, in row order."""

    state: RecurrentState
    #: ``(seq_id, rows)`` per sequence of the ubatch; the rows in position order.
    groups: tuple[tuple[int, np.ndarray], ...]
    n_rows: int

    def conv(self, il: int, seq: int) -> Any:
        return self.state.conv[il][seq]

    def ssm(self, il: int, seq: int) -> Any:
        return self.state.ssm[il][seq]

    def stacked(self, il: int) -> tuple[Any, Any]:
        """Layer ``il``'s conv and memory states of the ubatch's sequences, in group order,
        stacked ``(S, ...)`` (copies)."""
        seqs = np.array([seq for seq, _ in self.groups])
        return self.state.conv[il][seqs], self.state.ssm[il][seqs]

    def write_stacked(self, il: int, conv: Any, ssm: Any) -> None:
        """Put back what :meth:`stacked` gave, updated."""
        seqs = np.array([seq for seq, _ in self.groups])
        self.state.backend.set_rows(self.state.conv[il], seqs, conv)
        self.state.backend.set_rows(self.state.ssm[il], seqs, ssm)

    def write(self, il: int, seq: int, conv: Any, ssm: Any) -> None:
        b, row = self.state.backend, np.array([seq])
        b.set_rows(self.state.conv[il], row, conv.reshape(1, *conv.shape))
        b.set_rows(self.state.ssm[il], row, ssm.reshape(1, *ssm.shape))


class HybridCache(KVCache):
    """The KV cache of a model with recurrent layers: its sequence operations move the
    recurrent states too, and refuse (False, nothing changed) what would cut into one."""

    def __init__(self, *args: Any, recurrent: RecurrentState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recurrent = recurrent

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> bool:
        cut = self.recurrent.cut(seq_id, p0, p1)
        if cut == "refused":
            return False
        super().seq_rm(seq_id, p0, p1)
        if cut == "all":
            self.recurrent.zero(self.recurrent._seqs(seq_id))
        return True

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> bool:
        cut = self.recurrent.cut(src, p0, p1)
        if cut == "refused" or (cut == "all" and self.recurrent.pos[dst] >= 0):
            return False  # a part of a state, or onto a sequence that has one, cannot be
        super().seq_cp(src, dst, p0, p1)
        if cut == "all":
            self.recurrent.copy(src, dst)
        return True

    def seq_keep(self, seq_id: int) -> None:
        super().seq_keep(seq_id)
        others = np.setdiff1d(np.arange(len(self.recurrent.pos)), [seq_id])
        self.recurrent.zero(others)

    def clear(self) -> None:
        super().clear()
        self.recurrent.zero(np.arange(len(self.recurrent.pos)))

    def snapshot(self) -> Any:
        every = np.arange(len(self.recurrent.pos))
        return super().snapshot(), self.recurrent.snapshot(every)

    def restore(self, snapshot: Any) -> None:
        cells, states = snapshot
        super().restore(cells)
        self.recurrent.restore(states)

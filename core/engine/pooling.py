"""Embedding mode of a context: hidden states pooled per sequence, never the LM head.

:func:`encode_batch` is what :meth:`tessera.engine.context.Context.encode` runs. It asks the
architecture for final hidden states (``ForwardInput.embeddings``) of only the rows the
pooling needs, pools them per sequence the way llama.cpp's pooling types do, and for
``rank`` applies the classifier head GGUF files store as ``cls`` / ``cls.output``. No
``(T, n_vocab)`` logits buffer is ever made: the largest output is ``(T, n_embd)``.

Encoders (``Architecture.causal_attention`` False) keep no KV cache: every ubatch holds
whole sequences, packed up to ``n_ubatch`` tokens. Decoders run over the KV cache as in
generation; their cells are released when the call ends, so nothing carries over.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.contract.ops import Op
from tessera.engine.batch import Batch
from tessera.engine.kv_view import KVRows
from tessera.errors import TesseraError

#: llama.cpp's pooling types, in the order of GGUF ``{arch}.pooling_type`` numbers.
POOLING_TYPES = ("none", "mean", "cls", "last", "rank")


def pooling_name(value: int | str) -> str:
    """The pooling type name of a GGUF number or a name; TesseraError if unknown."""
    if isinstance(value, str) and value in POOLING_TYPES:
        return value
    if isinstance(value, int | np.integer) and 0 <= int(value) < len(POOLING_TYPES):
        return POOLING_TYPES[int(value)]
    raise TesseraError(f"unknown pooling type {value!r}; choose one of {', '.join(POOLING_TYPES)}")


def _sequence_rows(batch: Batch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sequence ids present (ascending), each row's index into them, and per sequence the
    row with the lowest and with the highest position."""
    ids, pos = batch.seq_ids, batch.positions
    if (ids == ids[0]).all():  # one input (batch-1 embedding): no sorting
        one = np.zeros(len(ids), np.intp)
        return ids[:1], one, pos.argmin(keepdims=True), pos.argmax(keepdims=True)
    seqs, inverse = np.unique(ids, return_inverse=True)
    by_pos = np.lexsort((batch.positions, inverse))  # rows grouped by sequence, by position
    counts = np.bincount(inverse, minlength=len(seqs))
    ends = np.cumsum(counts)
    return seqs, inverse, by_pos[ends - counts], by_pos[ends - 1]


class SequenceAttention:
    """Attention of an encoder ubatch: every row sees every row of its own sequence.

    What an encoder receives as ``ForwardInput.kv``. On the ``rows`` path (the context's
    :func:`~tessera.engine.context.choose_kv_path`) each sequence is one slice of
    ``attention_rows`` over the ubatch's own K/V, so the work is the sum of the squared
    sequence lengths; on the ``dense`` path it is one ``(T, T)`` same-sequence mask. A
    symmetric sliding window (``|pos_q - pos_k| < window``, bidirectional Gemma layers)
    takes the dense path when some input is longer than the window.
    """

    def __init__(self, seq_ids: np.ndarray, path: str, positions: np.ndarray | None = None) -> None:
        self.seq_ids = seq_ids
        self.path = path
        self.positions = np.zeros(len(seq_ids), np.int32) if positions is None else positions
        self._rows: KVRows | None = None
        self._mask: np.ndarray | None = None
        self._window_masks: dict[int, np.ndarray] = {}
        # one input needs no row lists: the dense mask is all True (and costs nothing)
        self._use_rows = path == "rows" and bool((seq_ids != seq_ids[0]).any())

    def rows(self) -> KVRows:
        """One slice per sequence; all positions 0, so the causal rule lets every row in."""
        if self._rows is None:
            _, inverse = np.unique(self.seq_ids, return_inverse=True)
            order = np.argsort(inverse, kind="stable")
            counts = np.bincount(inverse)
            rank = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
            rows = np.full((len(counts), int(counts.max())), -1, dtype=np.int64)
            rows[inverse[order], rank] = order
            q_index = np.empty(len(order), dtype=np.int64)
            q_index[order] = inverse[order] * rows.shape[1] + rank
            zeros = np.where(rows >= 0, 0, -1).astype(np.int32)
            self._rows = KVRows(rows, zeros, rows, zeros, q_index)
        return self._rows

    def mask(self) -> np.ndarray:
        if self._mask is None:
            self._mask = self.seq_ids[:, None] == self.seq_ids[None, :]
        return self._mask

    def attend(self, backend: Any, q: Any, k: Any, v: Any, scale: float, window: int = 0) -> Any:
        """``(T, H * D)`` attention of ``q`` over ``k``/``v`` ``(T, H, D)`` of the ubatch;
        with ``window > 0`` only rows less than ``window`` positions away."""
        if window > 0 and int(self.positions.max()) >= window:
            mask = self._window_masks.get(window)
            if mask is None:
                near = np.abs(self.positions[:, None] - self.positions[None, :]) < window
                mask = self._window_masks[window] = self.mask() & near
            return backend.attention(q, k, v, len(self.seq_ids), mask, scale)
        if self._use_rows:
            return backend.attention_rows(q, k, v, self.rows(), scale)
        return backend.attention(q, k, v, len(self.seq_ids), self.mask(), scale)


def _encoder_ubatches(
    batch: Batch, inverse: np.ndarray, n_ubatch: int
) -> list[np.ndarray] | list[slice]:
    """Row indices of ubatches that hold whole sequences, at most ``n_ubatch`` rows each;
    ``[slice(None)]`` for one input that fits (the batch as it is: no copies)."""
    if len(inverse) <= n_ubatch and not inverse.any():
        return [slice(None)]
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    longest = int(counts.max())
    if longest > n_ubatch:
        raise TesseraError(
            f"an input has {longest} tokens but the physical batch (-ub) holds {n_ubatch}; "
            "an encoder sees a whole input at once, so raise -ub (and -b) or shorten it"
        )
    groups: list[np.ndarray] = []
    start = size = 0
    for n in counts:
        if size + n > n_ubatch:
            groups.append(order[start : start + size])
            start, size = start + size, 0
        size += int(n)
    groups.append(order[start : start + size])
    return groups


def hidden_states(
    ctx: Any,
    batch: Batch,
    want: np.ndarray,
    token_types: np.ndarray | None = None,
    inverse: np.ndarray | None = None,
) -> np.ndarray:
    """Final hidden states of the rows ``want`` (bool ``(T,)``) as float32 ``(T, n_embd)``;
    rows not wanted are left zero. No KV cell of the batch stays in the cache. ``inverse``:
    each row's index among the batch's sequence ids, where the caller has it already."""
    model = ctx.model
    backend = model.backend
    causal = model.arch.causal_attention(model.config)
    groups: list[Any]
    if causal:
        groups = [
            np.arange(s, min(s + ctx.n_ubatch, len(batch)))
            for s in range(0, len(batch), ctx.n_ubatch)
        ]
    else:
        if inverse is None:
            inverse = np.unique(batch.seq_ids, return_inverse=True)[1]
        groups = _encoder_ubatches(batch, inverse, ctx.n_ubatch)
    out: np.ndarray | None = None
    written: list[np.ndarray] = []
    # recurrent states carry across the ubatches from zero and are put back afterwards
    rec = ctx.recurrent if causal else None
    saved = None if rec is None else rec.snapshot(np.unique(batch.seq_ids))
    if rec is not None:
        rec.zero(saved[0])
    try:
        for rows in groups:
            seq_ids, positions = batch.seq_ids[rows], batch.positions[rows]
            kv: Any = SequenceAttention(seq_ids, ctx.kv_path, positions)
            if causal:
                cells = ctx.kv.find_slot(len(rows), seq_ids)
                ctx.kv.commit(cells, positions, seq_ids)
                written.append(cells)
                kv = ctx.kv.view(cells, positions, seq_ids, ctx.kv_path)
            inp = ForwardInput(
                tokens=batch.tokens[rows],
                positions=positions,
                output_rows=np.flatnonzero(want[rows]),
                kv=kv,
                embeddings=True,
                seq_ids=seq_ids,
                token_types=None if token_types is None else token_types[rows],
                recurrent=None if rec is None else rec.view(seq_ids, positions),
            )
            with backend.forward_scope():
                h = model.graph.forward(inp)
            if len(inp.output_rows):
                h = backend.to_numpy(h)
                if isinstance(rows, slice) and len(h) == len(batch):
                    out = h  # every row of the batch wanted, in its order
                    ctx.output_buffers["embd"] += 1
                    continue
                if out is None:
                    out = np.zeros((len(batch), h.shape[-1]), dtype=np.float32)
                    ctx.output_buffers["embd"] += 1
                out[inp.output_rows if isinstance(rows, slice) else rows[inp.output_rows]] = h
    finally:
        for cells in written:
            ctx.kv.release(cells)
        if saved is not None:
            rec.restore(saved)
    assert out is not None  # every pooling wants at least one row
    return out


def classifier_head(model: Any, pooled: np.ndarray) -> np.ndarray:
    """Scores ``(n, n_cls_out)`` of ``rank`` pooling: ``cls.output(tanh(cls(x)))`` where the
    model has both layers (as llama.cpp's rank graph), float32 on the host."""
    b, w = model.backend, model.weights
    if "cls.output.weight" not in w and "cls.weight" not in w:
        raise TesseraError(
            "the model has no classifier head (cls / cls.output tensors), so it cannot rank; "
            "use a reranker model or another --pooling"
        )
    x = b.from_numpy(pooled)

    def dense(x: Any, name: str) -> Any:
        y = b.matmul(x, w[name + ".weight"])
        return y if name + ".bias" not in w else b.add(y, w[name + ".bias"])

    if "cls.weight" in w:
        x = dense(x, "cls")
        tanh = Op("tanh", dtype=b.dtype)
        x = b.tanh(x) if b.supports(tanh) else b.from_numpy(np.tanh(b.to_numpy(x)))
    if "cls.output.weight" in w:
        x = dense(x, "cls.output")
    return b.to_numpy(x).astype(np.float32)


def encode_batch(
    ctx: Any, batch: Batch, pooling: str, token_types: np.ndarray | None = None
) -> np.ndarray:
    """Run ``batch`` in embedding mode and pool (see :meth:`Context.encode`)."""
    pooling = pooling_name(pooling)
    seqs, inverse, first, last = _sequence_rows(batch)
    want = np.zeros(len(batch), dtype=bool)
    if pooling == "none":
        want = batch.output.copy()
        if not want.any():
            raise TesseraError("pooling none returns the output rows, but the batch marks none")
    elif pooling == "mean":
        want[:] = True
    elif pooling in ("cls", "rank"):
        want[first] = True
    else:
        want[last] = True
    h = hidden_states(ctx, batch, want, token_types, inverse)
    if pooling == "none":
        return h[want]
    if pooling == "rank":
        return classifier_head(ctx.model, h[first])
    return dense_out(ctx.model, _pool(pooling, h, inverse, len(seqs), first, last))


def dense_out(model: Any, pooled: np.ndarray) -> np.ndarray:
    """The projections some models apply after pooling (GGUF ``dense_2``, ``dense_3``:
    EmbeddingGemma's sentence-transformers Dense modules), in that order, without bias."""
    names = [n for n in ("dense_2.weight", "dense_3.weight") if n in model.weights]
    if not names:
        return pooled
    b = model.backend
    x = b.from_numpy(pooled)
    for name in names:
        x = b.matmul(x, model.weights[name])
    return b.to_numpy(x).astype(np.float32)


def _pool(
    pooling: str,
    h: np.ndarray,
    inverse: np.ndarray,
    n_seq: int,
    first: np.ndarray,
    last: np.ndarray,
) -> np.ndarray:
    if pooling == "mean" and n_seq == 1:
        return (h.sum(axis=0, keepdims=True) / len(h)).astype(np.float32)
    if pooling == "mean":
        # rows sorted by sequence, then one segmented sum (no Python loop, no BLAS call)
        order = np.argsort(inverse, kind="stable")
        counts = np.bincount(inverse, minlength=n_seq)
        sums = np.add.reduceat(h[order], np.cumsum(counts) - counts, axis=0)
        return (sums / counts[:, None]).astype(np.float32)
    return h[last] if pooling == "last" else h[first]

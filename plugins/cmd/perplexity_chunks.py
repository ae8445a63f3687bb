"""The chunks llama-perplexity scores, and the logits of their scored positions.

The tokenized text is cut into ``n_chunk`` consecutive chunks of ``n_ctx`` tokens (the tail
that does not fill one is dropped). Each chunk is evaluated from an empty KV cache at
positions ``0 .. n_ctx - 1``, its first token replaced by BOS when the vocabulary adds one;
only the second half is scored, so every scored token has at least ``n_ctx / 2`` tokens of
context: the logits at positions ``n_ctx // 2 .. n_ctx - 2`` predict the tokens after them.
Several chunks share one decode as parallel sequences when ``n_batch`` holds them
(``n_seq = n_batch // n_ctx``), and a chunk longer than ``n_batch`` is decoded in pieces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import TesseraError


@attrs.frozen
class ChunkPlan:
    """How a text of ``n_tokens`` is evaluated (llama.cpp's names)."""

    n_ctx: int
    n_batch: int
    n_chunk: int
    bos_id: int | None = None

    @property
    def first(self) -> int:
        """The first scored position of a chunk."""
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:
        """Tokens scored per chunk."""
        return self.n_ctx - 1 - self.first

    @property
    def n_seq(self) -> int:
        """Chunks decoded together as parallel sequences."""
        return max(1, min(self.n_batch // self.n_ctx, self.n_chunk))


def plan_chunks(
    n_tokens: int, n_ctx: int, n_batch: int, max_chunks: int, bos_id: int | None
) -> ChunkPlan:
    """The plan for a text of ``n_tokens``; ``max_chunks < 0`` takes every whole chunk.

    As llama-perplexity, a text needs at least ``2 * n_ctx`` tokens.
    """
    if n_tokens < 2 * n_ctx:
        raise TesseraError(
            f"the text has {n_tokens} tokens, but perplexity with a context of {n_ctx} needs "
            f"at least {2 * n_ctx} (two chunks); pass a longer text or a smaller -c"
        )
    n_chunk = n_tokens // n_ctx if max_chunks < 0 else min(max_chunks, n_tokens // n_ctx)
    return ChunkPlan(n_ctx=n_ctx, n_batch=n_batch, n_chunk=n_chunk, bos_id=bos_id)


def chunk_context(
    model: Any, plan: ChunkPlan, n_ubatch: int, flash_attn: str, type_k: str = "", type_v: str = ""
) -> Context:
    """A context for ``plan.n_seq`` chunks at a time, its K/V cache stored as ``type_k`` /
    ``type_v`` ("": the compute dtype)."""
    n_seq = plan.n_seq
    return Context(
        model,
        ContextParams(
            n_ctx=n_seq * plan.n_ctx,
            n_batch=min(plan.n_batch, n_seq * plan.n_ctx),
            n_ubatch=n_ubatch,
            n_seq_max=n_seq,
            flash_attn=flash_attn,
            type_k=type_k,
            type_v=type_v,
        ),
    )


def _piece(plan: ChunkPlan, chunk: np.ndarray, seq: int, start: int, size: int) -> Batch:
    """Tokens ``start .. start + size`` of one chunk as rows of sequence ``seq``."""
    tokens = chunk[start : start + size].copy()
    if start == 0 and plan.bos_id is not None:
        tokens[0] = plan.bos_id
    positions = np.arange(start, start + size)
    output = (positions >= plan.first) & (positions <= plan.n_ctx - 2)
    return Batch(tokens, positions, np.full(size, seq), output)


def scored_logits(
    ctx: Context, tokens: Sequence[int] | np.ndarray, plan: ChunkPlan
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """For each chunk, in order: its index, the float32 logits of its scored positions
    ``(plan.n_scored, n_vocab)`` and the tokens they predict ``(plan.n_scored,)``."""
    tokens = np.asarray(tokens, dtype=np.int32)
    n_ctx, n_seq = plan.n_ctx, plan.n_seq
    step = min(plan.n_batch, n_ctx)  # a chunk's piece per decode when it exceeds n_batch
    for group in range(0, plan.n_chunk, n_seq):
        seqs = range(min(n_seq, plan.n_chunk - group))
        chunks = [tokens[(group + s) * n_ctx : (group + s + 1) * n_ctx] for s in seqs]
        ctx.kv.clear()
        outputs = []
        for start in range(0, n_ctx, step):
            size = min(step, n_ctx - start)
            batch = Batch.concat([_piece(plan, chunks[s], s, start, size) for s in seqs])
            outputs.append(ctx.decode(batch))
        if len(outputs) == 1:  # one decode: rows are sequence after sequence
            per_seq = outputs[0].reshape(len(seqs), plan.n_scored, -1)
        else:  # pieces of the one sequence, in order
            per_seq = np.concatenate(outputs, axis=0)[None]
        for s in seqs:
            yield group + s, per_seq[s], chunks[s][plan.first + 1 :]

"""Batches of tokens for one decode call, and their split into ubatches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attrs
import numpy as np


def _int32(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)


@attrs.frozen
class Batch:
    """Tokens to evaluate: each row has a token, a position, a sequence id and an output flag.

    Rows of several sequences may be mixed; the KV cache keeps them apart. Only rows with
    ``output`` set produce logits (or embeddings).
    """

    tokens: np.ndarray = attrs.field(converter=_int32)
    positions: np.ndarray = attrs.field(converter=_int32)
    seq_ids: np.ndarray = attrs.field(converter=_int32)
    output: np.ndarray = attrs.field(converter=lambda v: np.ascontiguousarray(v, dtype=bool))

    def __attrs_post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.positions) == len(self.seq_ids) == len(self.output) == n):
            raise ValueError("tokens, positions, seq_ids and output must have the same length")

    @classmethod
    def for_sequence(
        cls, tokens: Sequence[int], start_pos: int = 0, seq_id: int = 0, logits: str = "last"
    ) -> Batch:
        """One sequence's tokens at consecutive positions; ``logits`` is "last", "all" or "none"."""
        n = len(tokens)
        output = np.zeros(n, dtype=bool)
        if logits == "all":
            output[:] = True
        elif logits == "last" and n:
            output[-1] = True
        return cls(tokens, np.arange(start_pos, start_pos + n), np.full(n, seq_id), output)

    @classmethod
    def concat(cls, batches: Sequence[Batch]) -> Batch:
        return cls(
            np.concatenate([b.tokens for b in batches]),
            np.concatenate([b.positions for b in batches]),
            np.concatenate([b.seq_ids for b in batches]),
            np.concatenate([b.output for b in batches]),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return int(self.output.sum())

    def split(self, n_ubatch: int) -> Iterator[Batch]:
        """Consecutive slices of at most ``n_ubatch`` rows (the unified cache needs no more)."""
        for start in range(0, len(self), n_ubatch):
            end = start + n_ubatch
            yield Batch(
                self.tokens[start:end],
                self.positions[start:end],
                self.seq_ids[start:end],
                self.output[start:end],
            )

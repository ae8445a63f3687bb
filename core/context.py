"""A context: one model, its KV cache and the decode loop over ubatches."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import numpy as np

from tessera.arch import ForwardInput
from tessera.batch import Batch
from tessera.errors import ContextOverflowError, TesseraError
from tessera.kv_cache import KVCache

log = logging.getLogger("tessera.context")


def _positive(instance: Any, attribute: Any, value: int) -> None:
    if value < 1:
        raise TesseraError(f"{attribute.name} must be at least 1, got {value}")


@attrs.frozen
class ContextParams:
    """Sizes of a context (llama.cpp's -c, -b, -ub, -np)."""

    n_ctx: int = attrs.field(default=2048, validator=_positive)
    n_batch: int = attrs.field(default=2048, validator=_positive)
    n_ubatch: int = attrs.field(default=512, validator=_positive)
    n_seq_max: int = attrs.field(default=1, validator=_positive)


class Context:
    """Evaluates batches of tokens against a model, keeping their K/V in a unified cache."""

    def __init__(self, model: Any, params: ContextParams | None = None) -> None:
        self.model = model
        self.params = params or ContextParams()
        p = self.params
        self.n_ubatch = min(p.n_ubatch, p.n_batch)
        self.kv = KVCache(model.backend, model.arch.kv_layout(model.config), p.n_ctx, p.n_seq_max)
        log.info(
            "context: n_ctx=%d n_batch=%d n_ubatch=%d n_seq_max=%d backend=%s dtype=%s",
            p.n_ctx,
            p.n_batch,
            self.n_ubatch,
            p.n_seq_max,
            model.backend.name,
            model.backend.dtype,
        )

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    def _validate(self, batch: Batch) -> None:
        if len(batch) == 0:
            raise TesseraError("the batch is empty; give at least one token")
        if len(batch) > self.params.n_batch:
            raise TesseraError(
                f"the batch has {len(batch)} tokens but n_batch is {self.params.n_batch}; "
                "raise -b or send fewer tokens at once"
            )
        n_vocab = self.model.n_vocab
        if batch.tokens.min() < 0 or batch.tokens.max() >= n_vocab:
            raise TesseraError(f"token ids must be in [0, {n_vocab}); the batch has one outside")
        if batch.seq_ids.min() < 0 or batch.seq_ids.max() >= self.params.n_seq_max:
            raise TesseraError(
                f"sequence ids must be in [0, {self.params.n_seq_max}); raise -np for more "
                "parallel sequences"
            )
        if batch.positions.max() >= self.n_ctx:
            raise ContextOverflowError(
                f"position {int(batch.positions.max())} does not fit in a context of "
                f"{self.n_ctx} tokens; raise -c or shorten the input"
            )

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate ``batch``; return float32 logits ``(batch.n_outputs, n_vocab)`` in row order.

        On error no cell of this batch stays in the cache.
        """
        self._validate(batch)
        written: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        backend = self.model.backend
        try:
            for ub in batch.split(self.n_ubatch):
                cells = self.kv.find_slot(len(ub))
                self.kv.commit(cells, ub.positions, ub.seq_ids)
                written.append(cells)
                inp = ForwardInput(
                    tokens=ub.tokens,
                    positions=ub.positions,
                    output_rows=np.flatnonzero(ub.output),
                    kv=self.kv.view(cells, ub.positions, ub.seq_ids),
                )
                logits = self.model.graph.forward(inp)
                if len(inp.output_rows):
                    outputs.append(backend.to_numpy(logits))
        except BaseException:
            for cells in written:
                self.kv.release(cells)
            raise
        if not outputs:
            return np.zeros((0, self.model.n_vocab), dtype=np.float32)
        return np.concatenate(outputs, axis=0)

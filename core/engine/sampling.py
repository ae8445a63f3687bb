"""Token sampling: penalties, top-k, top-p, min-p, temperature and a seeded draw.

The order follows llama.cpp's default chain: repetition penalty -> top-k -> top-p ->
min-p -> temperature -> draw. A temperature of 0 (or below) means greedy.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from tessera.errors import TesseraError


def _at_least(low: float):
    def check(instance, attribute, value):
        if value < low:
            raise TesseraError(f"{attribute.name} must be >= {low}, got {value}")

    return check


def _unit_interval(instance, attribute, value):
    if not 0.0 <= value <= 1.0:
        raise TesseraError(f"{attribute.name} must be between 0 and 1, got {value}")


@attrs.frozen
class SamplerParams:
    """Sampling settings (llama.cpp flags: --temp --top-k --top-p --min-p --repeat-penalty)."""

    temperature: float = 0.8
    top_k: int = attrs.field(default=40, validator=_at_least(0))  # 0 = off
    top_p: float = attrs.field(default=0.95, validator=_unit_interval)  # 1 = off
    min_p: float = attrs.field(default=0.05, validator=_unit_interval)  # 0 = off
    repeat_penalty: float = attrs.field(default=1.0, validator=_at_least(0.0))  # 1 = off
    repeat_last_n: int = attrs.field(default=64, validator=_at_least(0))
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """Draws tokens from logits with :class:`SamplerParams`; holds the seeded RNG."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        self.params = params or SamplerParams()
        self.rng = np.random.default_rng(self.params.seed)

    def apply_penalty(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        p = self.params
        if p.repeat_penalty == 1.0 or p.repeat_last_n == 0 or not len(history):
            return logits
        recent = np.unique(np.asarray(history[-p.repeat_last_n :], dtype=np.int64))
        logits = logits.copy()
        seen = logits[recent]
        logits[recent] = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        return logits

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from a ``(n_vocab,)`` logits row; ``history`` feeds the penalty."""
        logits = self.apply_penalty(np.asarray(logits, dtype=np.float32), history)
        if self.params.greedy:
            return int(np.argmax(logits))
        ids, probs = self._candidates(logits)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def probs(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The ``(n_vocab,)`` float64 distribution :meth:`sample` draws from (one-hot when
        greedy); speculative decoding's rejection rule compares drafts against it."""
        logits = self.apply_penalty(np.asarray(logits, dtype=np.float32), history)
        out = np.zeros(len(logits), dtype=np.float64)
        if self.params.greedy:
            out[int(np.argmax(logits))] = 1.0
            return out
        ids, probs = self._candidates(logits)
        out[ids] = probs
        return out

    def _candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids left after top-k, top-p and min-p, and their tempered probabilities."""
        p = self.params
        ids = np.arange(len(logits))
        if 0 < p.top_k < len(logits):
            keep = np.argpartition(-logits, p.top_k - 1)[: p.top_k]
            ids, logits = keep, logits[keep]
        order = np.argsort(-logits, kind="stable")
        ids, logits = ids[order], logits[order].astype(np.float64)
        probs = np.exp(logits - logits[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            n = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            ids, logits, probs = ids[:n], logits[:n], probs[:n]
        if p.min_p > 0.0:
            n = max(1, int(np.count_nonzero(probs >= p.min_p * probs[0])))
            ids, logits = ids[:n], logits[:n]
        scaled = (logits - logits[0]) / p.temperature
        weights = np.exp(scaled)
        return ids, weights / weights.sum()

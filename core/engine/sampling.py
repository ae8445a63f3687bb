"""Token sampling: penalties, top-k, top-p, min-p, temperature and a seeded draw.

The order follows llama.cpp's default chain: repetition penalty -> top-k -> top-p ->
min-p -> temperature -> draw. A temperature of 0 (or below) means greedy.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import attrs
import numpy as np

from tessera.errors import TesseraError

#: ``seed`` asking for a random seed, as llama.cpp's ``--seed -1`` and ``"seed": -1``.
RANDOM_SEED = -1
#: numpy's ``default_rng`` takes seeds in ``[0, SEED_LIMIT)`` here.
SEED_LIMIT = 2**64
_F32_MAX = float(np.finfo(np.float32).max)


class SamplerParamError(TesseraError):
    """A sampling setting outside its range; ``field`` names it (the server's ``param``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _in_range(
    value: object, integer: bool, low: float | None, high: float | None, above: bool
) -> bool:
    if isinstance(value, bool) or not isinstance(
        value, numbers.Integral if integer else numbers.Real
    ):
        return False
    # a huge int cannot become a float, so only floats are asked whether they are finite
    if not integer and not math.isfinite(value):
        return False
    if low is not None and (value <= low if above else value < low):
        return False
    return high is None or value <= high


def _check(
    integer: bool,
    low: float | None = None,
    high: float | None = None,
    *,
    above: bool = False,
    note: str = "",
):
    """A validator of an int (``integer``) or finite float field from ``low`` (exclusive when
    ``above``) to ``high``; its error names the field, the value and the range."""
    want = "an integer" if integer else "a finite number"
    if low is not None and high is not None:
        want += f" between {low:g} and {high:g}"
    elif low is not None:
        want += f" {'>' if above else '>='} {low:g}"
    if note:
        want += f" ({note})"

    def check(instance, attribute, value):
        if not _in_range(value, integer, low, high, above):
            raise SamplerParamError(
                attribute.name, f"{attribute.name} must be {want}, got {value!r}"
            )

    return check


def _random_seed(value: object) -> object:
    """-1 (llama.cpp's random seed) becomes None, which draws one from the OS."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == RANDOM_SEED:
        return None
    return value


def _seed_range(instance, attribute, value):
    if value is not None and not _in_range(value, True, 0, SEED_LIMIT - 1, False):
        raise SamplerParamError(
            "seed",
            f"seed must be an integer between 0 and 2**64 - 1, or {RANDOM_SEED} for a random "
            f"seed, got {value!r}",
        )


@attrs.frozen
class SamplerParams:
    """Sampling settings (llama.cpp flags: --temp --top-k --top-p --min-p --repeat-penalty
    --repeat-last-n --seed); each checks its range and raises :class:`SamplerParamError`."""

    temperature: float = attrs.field(
        default=0.8, validator=_check(False, note="0 or below = greedy")
    )
    #: As llama.cpp: 0 or below = off (the whole vocabulary).
    top_k: int = attrs.field(default=40, validator=_check(True, note="0 or below = off"))
    top_p: float = attrs.field(default=0.95, validator=_check(False, 0, 1, note="1 = off"))
    min_p: float = attrs.field(default=0.05, validator=_check(False, 0, 1, note="0 = off"))
    repeat_penalty: float = attrs.field(
        default=1.0, validator=_check(False, 0, above=True, note="1 = off")
    )
    #: As llama.cpp: -1 = every token so far (the whole context).
    repeat_last_n: int = attrs.field(
        default=64, validator=_check(True, -1, note="0 = off, -1 = the whole context")
    )
    #: None (or -1, stored as None): a random seed.
    seed: int | None = attrs.field(default=None, converter=_random_seed, validator=_seed_range)

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
        window = history if p.repeat_last_n < 0 else history[-p.repeat_last_n :]
        recent = np.unique(np.asarray(window, dtype=np.int64))
        logits = logits.copy()
        seen = logits[recent]
        # a penalty near 0 or a huge one overflows: clipped, as an infinite logit makes NaN odds
        with np.errstate(over="ignore", divide="ignore"):
            penalized = np.where(seen > 0, seen / p.repeat_penalty, seen * p.repeat_penalty)
        logits[recent] = np.clip(penalized, -_F32_MAX, _F32_MAX)
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

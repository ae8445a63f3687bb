"""Token sampling: the settings of the sampler chain and the seeded sampler that runs it.

The order follows llama.cpp's default chain (see :mod:`tessera.engine.sampler_chain`):
penalties -> DRY -> top-n-sigma -> top-k -> typical-p -> top-p -> min-p -> XTC ->
temperature -> draw. A temperature of 0 (or below) means greedy: the most likely token
after the penalties and DRY, the history-dependent stages (the truncating stages would
keep it, except typical-p and XTC, which are for sampling and are skipped).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tessera.engine import sampler_chain as chain
from tessera.engine.dry import DEFAULT_BREAKERS, DryBreakers, dry_penalty
from tessera.errors import TesseraError

#: ``seed`` asking for a random seed, as llama.cpp's ``--seed -1`` and ``"seed": -1``.
RANDOM_SEED = -1
#: numpy's ``default_rng`` takes seeds in ``[0, SEED_LIMIT)`` here.
SEED_LIMIT = 2**64


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


def _strings(value: object) -> tuple[str, ...]:
    """A list of strings as a tuple (a lone string is not taken for a list of letters)."""
    if (
        isinstance(value, str)
        or not isinstance(value, Sequence)
        or not all(isinstance(v, str) for v in value)
    ):
        message = f"dry_sequence_breakers must be a list of strings, got {value!r}"
        raise SamplerParamError("dry_sequence_breakers", message)
    return tuple(value)


@attrs.frozen
class SamplerParams:
    """Sampling settings under llama.cpp's names (flags --temp --top-k --top-p --min-p
    --repeat-penalty --repeat-last-n --presence-penalty --frequency-penalty --typical
    --top-n-sigma --xtc-* --dry-* --seed); each checks its range and raises
    :class:`SamplerParamError`."""

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
    #: Subtracted once from the logit of every token seen in the last repeat_last_n.
    presence_penalty: float = attrs.field(default=0.0, validator=_check(False, note="0 = off"))
    #: Subtracted from a seen token's logit once per time it was seen.
    frequency_penalty: float = attrs.field(default=0.0, validator=_check(False, note="0 = off"))
    typical_p: float = attrs.field(default=1.0, validator=_check(False, note="1 or above = off"))
    top_n_sigma: float = attrs.field(default=-1.0, validator=_check(False, note="0 or below = off"))
    xtc_probability: float = attrs.field(default=0.0, validator=_check(False, 0, 1, note="0 = off"))
    xtc_threshold: float = attrs.field(
        default=0.1, validator=_check(False, 0, 1, note="above 0.5 = off")
    )
    dry_multiplier: float = attrs.field(default=0.0, validator=_check(False, 0, note="0 = off"))
    dry_base: float = attrs.field(default=1.75, validator=_check(False, 1))
    dry_allowed_length: int = attrs.field(default=2, validator=_check(True, 0))
    dry_penalty_last_n: int = attrs.field(
        default=64, validator=_check(True, -1, note="0 = off, -1 = the whole context")
    )
    #: The breakers as text (what a request gave, what /props shows) ...
    dry_sequence_breakers: tuple[str, ...] = attrs.field(
        default=DEFAULT_BREAKERS, converter=_strings
    )
    #: ... and in token form, made with the model's vocabulary (None: no breakers yet).
    dry_breakers: DryBreakers | None = attrs.field(default=None, eq=False, repr=False)
    #: None (or -1, stored as None): a random seed.
    seed: int | None = attrs.field(default=None, converter=_random_seed, validator=_seed_range)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def with_vocabulary(self, tokenizer: Any) -> SamplerParams:
        """These settings with DRY's breakers in the token form of ``tokenizer`` (the same
        settings when DRY is off or the breakers are already made)."""
        if self.dry_multiplier == 0.0 or self.dry_breakers is not None:
            return self
        breakers = DryBreakers.for_tokenizer(self.dry_sequence_breakers, tokenizer)
        return attrs.evolve(self, dry_breakers=breakers)

    @property
    def needs_full_distribution(self) -> bool:
        """Whether a stage reads every candidate's probability: typical-p, top-n-sigma or
        XTC (a constrained sampler cannot then look at only the best few tokens)."""
        xtc_on = self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5
        return self.typical_p < 1.0 or self.top_n_sigma > 0.0 or xtc_on


class Sampler:
    """Draws tokens from logits with :class:`SamplerParams`; holds the seeded RNG."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        self.params = params or SamplerParams()
        self.rng = np.random.default_rng(self.params.seed)

    def apply_penalty(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The history-dependent stages: repetition/frequency/presence penalties, then DRY."""
        p = self.params
        logits = chain.penalties(
            logits,
            history,
            p.repeat_last_n,
            p.repeat_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
        return dry_penalty(
            logits,
            history,
            p.dry_multiplier,
            p.dry_base,
            p.dry_allowed_length,
            p.dry_penalty_last_n,
            p.dry_breakers,
        )

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from a ``(n_vocab,)`` logits row; ``history`` feeds the penalties."""
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
        """Token ids left after the truncating stages, and their tempered probabilities."""
        p = self.params
        ids, kept = chain.top_k(chain.top_n_sigma(logits, p.top_n_sigma), p.top_k)
        ids, kept = chain.typical(ids, kept, p.typical_p)
        ids, kept = chain.top_p(ids, kept, p.top_p)
        ids, kept = chain.min_p(ids, kept, p.min_p)
        ids, kept = chain.xtc(ids, kept, p.xtc_probability, p.xtc_threshold, self.rng)
        return ids, chain.tempered(kept, p.temperature)

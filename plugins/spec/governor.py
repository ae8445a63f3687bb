"""The speculative governor: drafts only while drafting pays, in seconds per emitted token.

Every decoder this plugin creates carries one (:attr:`tessera.contract.spec.SpecDecoder.
governor`); the core's single-sequence loop asks it before each step and tells it how long
the step took (:class:`tessera.engine.drafting.Drafter`). A third-party decoder may carry
its own :class:`tessera.contract.spec.DraftGovernor`, or none and draft at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from tessera.contract.spec import SpecDecoder, SpecParams


@attrs.define
class SpecGovernor:
    """Drafts only while drafting pays, measured in seconds per emitted token.

    Acceptance alone cannot tell: a drafter that is right 60% of the time still loses when
    drafting and verifying cost more than the tokens it saves. The governor keeps moving
    averages of the wall time of plain steps (no draft, one token each) and of the time and
    the tokens of speculative steps (draft + verify + the drafter's bookkeeping; a step
    whose drafter proposed nothing counts too), so that their ratio is the recent seconds
    per token of speculation: a ratio of averages, since a few long accepted drafts are
    what pays for many short ones. While speculation is clearly slower per token (by
    ``margin``, after ``min_evidence`` speculative steps) it drafts only in probes,
    separated by a stretch of plain steps that doubles after each losing probe (up to
    ``max_off``); a winning step resets the stretch. It starts with ``n_calibrate`` plain
    steps, and re-times plain decoding every ``replain_every`` speculative steps so the
    comparison follows load changes. It is kept on the decoder
    (:attr:`SpecDecoder.governor`), so its timings carry over generations; a new
    generation probes again within ``restart_off`` steps. Like the adaptive length it
    governs drafters whose drafting costs time, not lookups (``cheap_drafts``).
    """

    enabled: bool = True
    n_calibrate: int = 2
    replain_every: int = 32
    max_off: int = 128
    restart_off: int = 16
    #: Pause only when speculation is this much slower per token (timings are noisy) ...
    margin: float = 0.1
    #: ... and only after this many speculative steps have been timed.
    min_evidence: int = 3
    alpha: float = 0.25  # weight of the newest step in the moving averages
    t_plain: float | None = None  # seconds per plain step (= per token)
    s_spec: float | None = None  # seconds per speculative step
    n_spec: float | None = None  # tokens per speculative step
    n_plain: int = 0
    n_spec_steps: int = 0
    since_plain: int = 0
    off: int = 0  # plain steps left before the next probe
    stretch: int = 2

    def begin(self) -> None:
        """A new generation: keep the timings, but probe again within ``restart_off``
        steps (a drafter that lost on one text, such as a lookup, may win on the next)."""
        self.off = min(self.off, self.restart_off)
        self.stretch = min(self.stretch, 2 * self.restart_off)

    def allow(self) -> bool:
        """Whether the next step may carry a draft."""
        if not self.enabled:
            return True
        if self.n_plain < self.n_calibrate or self.since_plain >= self.replain_every:
            return False
        if self.off > 0:
            self.off -= 1
            return False
        return True

    def record(self, drafted: bool, seconds: float, n_emitted: int) -> None:
        """One step took ``seconds`` and emitted ``n_emitted`` tokens."""
        if not drafted:
            self.t_plain = _ema(self.t_plain, seconds / max(n_emitted, 1), self.alpha)
            self.n_plain += 1
            self.since_plain = 0
            return
        self.since_plain += 1
        self.s_spec = _ema(self.s_spec, seconds, self.alpha)
        self.n_spec = _ema(self.n_spec, n_emitted, self.alpha)
        self.n_spec_steps += 1
        losing = self.t_plain is not None and self.t_spec > self.t_plain * (1 + self.margin)
        if losing and self.n_spec_steps >= self.min_evidence:
            self.off, self.stretch = self.stretch, min(self.stretch * 2, self.max_off)
        else:
            self.stretch = 2

    @property
    def t_spec(self) -> float:
        """Recent seconds per token of speculative steps (inf before any token)."""
        return self.s_spec / self.n_spec if self.s_spec is not None and self.n_spec else math.inf

    @property
    def speedup(self) -> float:
        """Measured plain / speculative time per token (0 before both are known)."""
        return self.t_plain / self.t_spec if self.t_plain else 0.0


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


def governed(
    create: Callable[[Any, SpecParams, Any], SpecDecoder],
) -> Callable[[Any, SpecParams, Any], SpecDecoder]:
    """``create`` whose decoders each carry a :class:`SpecGovernor` of their own."""

    def create_governed(target: Any, params: SpecParams, runtime: Any) -> SpecDecoder:
        decoder = create(target, params, runtime)
        decoder.governor = SpecGovernor()
        return decoder

    return create_governed

"""The policy around a drafter: how many tokens to ask for, and whether drafting pays.

:class:`Drafter` wraps a :class:`tessera.contract.spec.SpecDecoder` for one generation:
:class:`DraftLength` sets how many tokens to ask for (growing while drafts are accepted,
shrinking on rejection), :class:`SpecGovernor` (in the single-sequence loop) pauses
drafting while it measurably costs more time per token than it saves, and every proposal
is trimmed to the room the caller has (:func:`tessera.engine.verify.trim_draft`).
Switch: ``TESSERA_SPEC_ADAPTIVE=0`` drafts at every step with the length fixed at
``--draft-max`` (no adaptive length, no governor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from tessera.contract.spec import Draft, SpecDecoder, SpecParams
from tessera.engine.verify import NO_DRAFT, trim_draft
from tessera.switches import SPEC_ADAPTIVE, flag


@attrs.define
class DraftLength:
    """How many tokens to ask for next: grows while drafts are accepted, shrinks on
    rejection, and after repeated total misses pauses drafting for a growing stretch."""

    n_max: int
    adaptive: bool = True
    n: int = 0
    pause: int = 0  # plain steps left before drafting again
    backoff: int = 1

    def __attrs_post_init__(self) -> None:
        self.n = self.n_max

    def next(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.n

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not self.adaptive or n_drafted == 0:
            return
        if n_accepted == n_drafted:
            self.n = min(self.n_max, self.n * 2)
            self.backoff = 1
        elif n_accepted == 0 and self.n == 1:
            self.pause, self.backoff = self.backoff, min(self.backoff * 2, 16)
        else:
            self.n = max(1, n_accepted + 1)


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
    comparison follows load changes. The loop keeps it on the decoder
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


class Drafter:
    """A spec decoder with the loop's policy around it, for one generation of ``prompt``
    in sequence ``seq_id``. ``governed`` adds a :class:`SpecGovernor`, kept on the decoder
    so that what it measured carries over generations."""

    def __init__(
        self,
        decoder: SpecDecoder,
        params: SpecParams,
        prompt: Sequence[int],
        seq_id: int,
        *,
        n_max: int,
        governed: bool = False,
    ) -> None:
        self.decoder, self.params = decoder, params
        self.prompt, self.seq_id = prompt, seq_id
        adaptive = params.adaptive and flag(SPEC_ADAPTIVE) and not decoder.cheap_drafts
        self.length = DraftLength(n_max, adaptive)
        self.governor: SpecGovernor | None = None
        if governed:
            if decoder.governor is None or decoder.governor.enabled != adaptive:
                decoder.governor = SpecGovernor(enabled=adaptive)
            self.governor = decoder.governor
            self.governor.begin()
        self.started = False
        #: Whether the last :meth:`propose` asked the decoder (it paid for drafting).
        self.asked = False

    def begin(self) -> None:
        """Tell the decoder the prompt is in the target's cache (else done on first use)."""
        self.decoder.begin(self.prompt, self.seq_id)
        self.started = True

    def propose(self, history: Sequence[int], room: int) -> Draft:
        """The next draft after ``history``, at most ``room`` tokens (may be empty)."""
        n_max = min(self.length.next(), room)
        if self.governor is not None and not self.governor.allow():
            n_max = 0
        self.asked = n_max > 0
        if not self.asked:
            return NO_DRAFT
        if not self.started:
            self.begin()
        return trim_draft(self.decoder.draft(history, n_max), n_max, self.params.draft_min)

    def verified(self, n_drafted: int, n_accepted: int) -> None:
        """The target kept ``n_accepted`` of ``n_drafted`` tokens: adapt the length."""
        self.length.update(n_drafted, n_accepted)

    def accepted(self, history: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        """The generation goes on after the step: let the decoder update its state."""
        self.decoder.accepted(history, n_drafted, n_accepted)

    def timed(self, seconds: float, n_emitted: int) -> None:
        """The step took ``seconds`` and emitted ``n_emitted`` tokens (for the governor)."""
        if self.governor is not None:
            self.governor.record(self.asked, seconds, n_emitted)


def create_decoder(runtime: Any, name: str, ctx: Any, params: SpecParams) -> SpecDecoder:
    """The spec decoder ``name`` from the plugin registry, bound to ``ctx``."""
    return runtime.spec_decoder(name).create(ctx, params, runtime)

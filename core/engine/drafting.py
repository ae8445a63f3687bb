"""The loop's policy around a drafter: how many tokens to ask for, and when to ask.

:class:`Drafter` wraps a :class:`tessera.contract.spec.SpecDecoder` for one generation:
:class:`DraftLength` sets how many tokens to ask for (growing while drafts are accepted,
shrinking on rejection), the decoder's own governor (:class:`tessera.contract.spec.
DraftGovernor`, in the single-sequence loop; the spec plugin's pauses drafting while it
costs more time per token than it saves) says whether a step may draft at all, and every
proposal is trimmed to the room the caller has (:func:`tessera.engine.verify.trim_draft`).
Switch: ``TESSERA_SPEC_ADAPTIVE=0`` drafts at every step with the length fixed at
``--draft-max`` (no adaptive length, no governor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from tessera.contract.spec import Draft, DraftGovernor, SpecDecoder, SpecParams
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


class Drafter:
    """A spec decoder with the loop's policy around it, for one generation of ``prompt``
    in sequence ``seq_id``. ``governed`` consults the decoder's governor (when it has one
    and the length is adaptive), kept on the decoder so that its timings carry over."""

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
        self.governor: DraftGovernor | None = decoder.governor if governed and adaptive else None
        if self.governor is not None:
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

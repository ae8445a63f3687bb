"""What a speculative-decoder plugin registers, and the base class of its drafters.

A speculative decoder proposes a few next tokens cheaply; :mod:`tessera.engine.generate`
checks them against the target model in one batch and keeps the longest prefix the
target agrees with. A plugin registers a :class:`SpecDecoderInfo` through the
``tessera_register_spec_decoders`` hook; its ``create(target, params, runtime)`` returns a
:class:`SpecDecoder` bound to one target context. The verification loop then calls
:meth:`SpecDecoder.begin` once per generation and :meth:`SpecDecoder.draft` before each
target batch; a drafter with state of its own (a draft model's KV cache) rolls it back
to the part of the history that it finds unchanged at the next call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from tessera.errors import TesseraError


def _non_negative(instance: Any, attribute: Any, value: int) -> None:
    if value < 0:
        raise TesseraError(f"{attribute.name} must be >= 0, got {value}")


def _probability(instance: Any, attribute: Any, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise TesseraError(f"{attribute.name} must be between 0 and 1, got {value}")


@attrs.frozen
class SpecParams:
    """Settings of speculative decoding (llama.cpp's flags in brackets)."""

    #: Most tokens drafted per target batch [--draft-max].
    draft_max: int = attrs.field(default=16, validator=_non_negative)
    #: Fewer drafted tokens than this are not worth a batch: decode plainly [--draft-min].
    draft_min: int = attrs.field(default=0, validator=_non_negative)
    #: A drafter stops when its own probability of the next token drops below this
    #: [--draft-p-min].
    p_min: float = attrs.field(default=0.75, validator=_probability)
    #: Draft model file for the ``draft`` and ``select`` types [-md].
    model_draft: str | None = None
    #: The draft context's ubatch size; None = the target's [--spec-draft-n-ubatch].
    n_ubatch_draft: int | None = None
    #: Shrink the draft length while drafts are rejected and grow it back while they are
    #: accepted (so a poor drafter costs little); ``TESSERA_SPEC_ADAPTIVE=0`` turns it off.
    adaptive: bool = True
    #: Backend name and dtype for a draft model (None: as the target).
    backend: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.draft_min > self.draft_max:
            raise TesseraError(
                f"--draft-min ({self.draft_min}) must not exceed --draft-max ({self.draft_max})"
            )


@attrs.frozen
class Draft:
    """Proposed next tokens and, optionally, the distribution each one was drawn from.

    ``probs`` is None for a deterministic proposal (each token proposed with certainty:
    the rejection rule then accepts token ``d`` with the target's probability ``p(d)``);
    otherwise ``(len(tokens), n_vocab)`` float rows that each sum to 1, row ``i`` being
    the distribution token ``i`` was sampled from.
    """

    tokens: tuple[int, ...] = attrs.field(converter=lambda t: tuple(int(x) for x in t))
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class DraftGovernor(Protocol):
    """Whether the next step may carry a draft, judged by what the past steps cost."""

    def begin(self) -> None:
        """A new generation starts (what was measured before is kept)."""

    def allow(self) -> bool:
        """Whether the next step may draft."""
        ...

    def record(self, drafted: bool, seconds: float, n_emitted: int) -> None:
        """A step (with a draft or without) took ``seconds`` and emitted ``n_emitted``."""


class SpecDecoder(ABC):
    """A drafter bound to one target context (base class of spec-decoder plugins)."""

    #: True when the drafter needs the target's hidden state (and so logits) for every
    #: prompt row, not only the last (MTP heads read ``h_i`` of each position).
    needs_all_prompt_outputs: bool = False
    #: True when drafting costs next to nothing (a lookup): the loop then always asks for
    #: ``--draft-max`` tokens, since only the adaptive length's savings are in drafting.
    cheap_drafts: bool = False
    #: A :class:`DraftGovernor` the single-sequence loop asks whether a step may draft, kept
    #: across generations so that what it measured (does drafting pay?) carries over; the
    #: spec plugin's decoders carry a ``tessera.plugins.spec.governor.SpecGovernor``. None:
    #: draft at every step the draft length allows.
    governor: DraftGovernor | None = None

    def begin(self, prompt: Sequence[int], seq_id: int) -> None:  # noqa: B027
        """A new generation starts: ``prompt`` is in the target's cache for ``seq_id``."""

    @abstractmethod
    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        """Propose up to ``n_max`` tokens to follow ``history`` (prompt + tokens so far).

        The target has evaluated ``history[:-1]``; the last token is evaluated together
        with the draft. Return fewer tokens (or none) when unsure.
        """

    def accepted(self, history: Sequence[int], n_drafted: int, n_accepted: int) -> None:  # noqa: B027
        """The target kept ``n_accepted`` of ``n_drafted`` tokens; ``history`` now ends
        with those and the target's own next token, so the target batch just evaluated
        started at position ``len(history) - n_accepted - 2``. Called after every target
        batch while the generation goes on (also after batches without a draft). Drafters
        that keep state update it here or at the next :meth:`draft`."""

    def close(self) -> None:  # noqa: B027
        """Free what the drafter holds (contexts, caches)."""


@attrs.frozen
class SpecDecoderInfo:
    """A registered speculative decoder type (``--spec-type NAME``)."""

    name: str
    #: ``create(target_ctx, params, runtime) -> SpecDecoder``. Raise a
    #: :class:`tessera.errors.TesseraError` naming what is missing when the target (or
    #: the draft file) cannot be used: e.g. no MTP layers, or a different vocabulary.
    create: Callable[[Any, SpecParams, Any], SpecDecoder]
    description: str = ""

"""The data the slot engine takes and gives back: a request, its events, its handle.

A front end (the HTTP server, a test, an embedding program) submits a
:class:`GenerationRequest` and receives :class:`TokenEvent`\\ s and one final
:class:`FinishEvent` through a callback that the engine calls on its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from tessera.engine.sampling import SamplerParams
from tessera.errors import TesseraError

#: Why a generation ended, as OpenAI's ``finish_reason`` spells the first two.
FINISH_REASONS = ("stop", "length", "cancelled", "error")


class EngineBusyError(TesseraError):
    """Every slot is busy and the wait queue is full (HTTP 503)."""


class SlotError(TesseraError):
    """A slot action or slot file name cannot be used."""


class SlotNotFoundError(SlotError):
    """The slot, or the slot file, does not exist (HTTP 404)."""


class SlotBusyError(SlotError):
    """The slot is processing a request (HTTP 409)."""


def _tokens(value: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in value)


@attrs.frozen
class GenerationRequest:
    """One completion to run in a slot."""

    prompt: tuple[int, ...] = attrs.field(converter=_tokens)
    #: Most tokens to generate; -1 = until an end-of-generation token or the context is full.
    max_tokens: int = -1
    sampler: SamplerParams = attrs.field(factory=SamplerParams)
    #: Report the chosen token's log-probability and this many top alternatives (None = off).
    logprobs: int | None = None
    #: Run in this slot (-1: the engine picks, preferring the longest cached prefix).
    id_slot: int = -1
    #: Reuse the slot's cached prefix; False evaluates the whole prompt again.
    cache_prompt: bool = True
    #: Make a per-request constraint (``allows``/``accept``/``sample``/``complete``), e.g.
    #: the JSON-object grammar of ``response_format``; None = unconstrained.
    constraint: Callable[[], Any] | None = attrs.field(default=None, eq=False)
    #: Never draw an end-of-generation token (generate to max_tokens or the context end).
    ignore_eos: bool = False
    #: ``(token, bias)`` pairs added to the logits before sampling (OpenAI's logit_bias).
    logit_bias: tuple[tuple[int, float], ...] = ()


@attrs.frozen
class TokenEvent:
    """One generated token (never an end-of-generation token)."""

    token: int
    logprob: float | None = None
    #: ``(token, logprob)`` of the most likely tokens, best first, when logprobs were asked.
    top_logprobs: tuple[tuple[int, float], ...] = ()


@attrs.frozen
class FinishEvent:
    """The last event of a request: why it ended and what it cost."""

    reason: str
    n_prompt: int
    #: Prompt tokens found in the slot's cache and not evaluated again.
    n_cached: int
    n_generated: int
    t_prompt_ms: float
    t_generate_ms: float
    id_slot: int
    error: str | None = None


class Task:
    """A submitted request: its id, a cancel switch, and the callback for its events."""

    def __init__(
        self, task_id: int, request: GenerationRequest, on_event: Callable[[Any], None]
    ) -> None:
        self.id = task_id
        self.request = request
        self.on_event = on_event
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop generating at the next step and free the slot (safe from any thread)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

"""The data of the slot engine: a request, its events and handle, the slots, the metrics.

A front end (the HTTP server, a test, an embedding program) submits a
:class:`GenerationRequest` and receives :class:`TokenEvent`\\ s and one final
:class:`FinishEvent` through a callback that the engine calls on its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from tessera.engine.sampling import SamplerParams
from tessera.errors import ContextOverflowError, TesseraError

if TYPE_CHECKING:
    from tessera.contract.spec import SpecParams
    from tessera.engine.drafting import Drafter
    from tessera.engine.sampling import Sampler

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
    #: Report :class:`tessera.engine.progress.PromptProgress` events while the prompt is read.
    report_progress: bool = False


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
        #: The slot it runs in, set before its first event (-1 while it waits).
        self.id_slot = -1
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop generating at the next step and free the slot (safe from any thread)."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@attrs.define
class EngineMetrics:
    """Counters since start (read by /metrics; plain ints, written by the engine thread)."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_rejected: int = 0
    n_prompt_tokens: int = 0  # evaluated
    n_prompt_tokens_cached: int = 0  # reused from a slot's cache
    n_tokens_predicted: int = 0
    n_decode_calls: int = 0
    n_batch_rows: int = 0
    t_prompt_ms: float = 0.0
    t_generate_ms: float = 0.0
    n_prompt_store_saved: int = 0
    n_prompt_store_restored: int = 0
    n_drafted: int = 0
    n_draft_accepted: int = 0


@attrs.define(eq=False)
class Slot:
    """One parallel sequence: its cached tokens and, while busy, its request's state."""

    id: int
    #: Tokens whose K/V the cache holds for this sequence, at positions 0, 1, ...
    cache_tokens: list[int] = attrs.field(factory=list)
    last_used: float = 0.0
    task: Task | None = None
    prompt: tuple[int, ...] = ()
    n_done: int = 0  # prompt tokens in the cache (cached or evaluated)
    n_cached: int = 0
    pending: int | None = None  # the last sampled token, not yet evaluated
    n_generated: int = 0
    sampler: Sampler | None = None
    constraint: Any = None
    history: list[int] = attrs.field(factory=list)
    t_start: float = 0.0
    t_first: float | None = None
    #: This slot's spec decoder (made on first use, kept across requests) and, while a
    #: request speculates, the :class:`~tessera.engine.drafting.Drafter` around it.
    spec_decoder: Any = None
    drafter: Drafter | None = None

    @property
    def state(self) -> str:
        if self.task is None:
            return "idle"
        return "generating" if self.pending is not None else "prompt"

    def info(self) -> dict[str, Any]:
        """The slot as ``/slots`` lists it."""
        busy = self.task is not None
        return {
            "id": self.id,
            "state": self.state,
            "is_processing": busy,
            "id_task": self.task.id if busy else None,
            "n_cached_tokens": len(self.cache_tokens),
            "n_prompt": len(self.prompt) if busy else 0,
            "n_generated": self.n_generated if busy else 0,
        }


@attrs.frozen
class SlotSpec:
    """Speculative decoding in the slots: ``create()`` makes one drafter
    (:class:`tessera.contract.spec.SpecDecoder`) per slot, bound to the engine's context."""

    name: str
    params: SpecParams
    create: Callable[[], Any] = attrs.field(eq=False)


def finish_event(
    slot: Slot | None, task: Task, reason: str, error: str | None = None
) -> FinishEvent:
    """The :class:`FinishEvent` of ``task``, ended in ``slot`` (None: before it got one)."""
    if slot is None:
        return FinishEvent(reason, len(task.request.prompt), 0, 0, 0.0, 0.0, -1, error)
    now = time.perf_counter()
    t_first = slot.t_first if slot.t_first is not None else now
    return FinishEvent(
        reason=reason,
        n_prompt=len(slot.prompt),
        n_cached=slot.n_cached,
        n_generated=slot.n_generated,
        t_prompt_ms=(t_first - slot.t_start) * 1e3,
        t_generate_ms=(now - t_first) * 1e3,
        id_slot=slot.id,
        error=error,
    )


def validate_request(request: GenerationRequest, n_ctx: int, n_vocab: int, n_slots: int) -> None:
    """Refuse a request the engine cannot run: an empty prompt, one that fills the
    context, token ids outside the vocabulary, a slot that does not exist."""
    n_prompt = len(request.prompt)
    if n_prompt == 0:
        raise TesseraError("the prompt is empty; give at least one token")
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {n_prompt} tokens but the context holds {n_ctx} (and needs "
            "room for at least one generated token); shorten the prompt or start the "
            "server with a larger context (-c)"
        )
    if min(request.prompt) < 0 or max(request.prompt) >= n_vocab:
        raise TesseraError(f"prompt token ids must be in [0, {n_vocab})")
    if not -1 <= request.id_slot < n_slots:
        raise SlotError(
            f"id_slot {request.id_slot} does not exist; this server has slots "
            f"0..{n_slots - 1} (or -1 for any)"
        )

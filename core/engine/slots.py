"""The slot engine: parallel sequences over one context, continuously batched.

A context made with ``n_seq_max = N`` gets N slots; slot ``i`` is KV-cache sequence ``i``.
One engine thread runs the loop: admit queued requests into idle slots, build one batch
from every busy slot (each generating slot's last token first, then prompt chunks of the
slots still reading their prompt, up to ``n_batch`` rows), decode it, sample the output
rows and report tokens. New requests join between steps (continuous batching).

A slot keeps the tokens whose K/V it holds after its request ends; a new request that
shares a prefix with them reuses those cells and evaluates only the rest (the prompt
cache). Slot state can be written to a file and read back (:meth:`SlotEngine.save_slot`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.contract.spec import SpecParams
from tessera.engine.context import Context
from tessera.engine.drafting import Drafter
from tessera.engine.prompt_cache import MIN_TOKENS, PromptStore, common_prefix
from tessera.engine.sampling import Sampler
from tessera.engine.scheduler import step
from tessera.engine.slot_types import (
    EngineBusyError,
    FinishEvent,
    GenerationRequest,
    SlotBusyError,
    SlotError,
    SlotNotFoundError,
    Task,
    TokenEvent,
)
from tessera.errors import ContextOverflowError, TesseraError

log = logging.getLogger("tessera.slots")


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


@attrs.frozen
class SlotSpec:
    """Speculative decoding in the slots: ``create()`` makes one drafter
    (:class:`tessera.contract.spec.SpecDecoder`) per slot, bound to the engine's context."""

    name: str
    params: SpecParams
    create: Callable[[], Any] = attrs.field(eq=False)


_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def slot_file_path(directory: str | Path, filename: str) -> Path:
    """``directory / filename`` for a slot file, refusing anything but a plain file name."""
    if not isinstance(filename, str) or not _SAFE_NAME.fullmatch(filename) or ".." in filename:
        raise SlotError(
            f"invalid slot file name {filename!r}: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit, with no path separators or '..'"
        )
    return Path(directory) / filename


class SlotEngine:
    """Runs requests in the slots of ``ctx`` on one background thread."""

    def __init__(
        self,
        ctx: Context,
        eog_ids: Collection[int] = (),
        max_queue: int = 64,
        prompt_store_bytes: int = 0,
        spec: SlotSpec | None = None,
    ) -> None:
        self.ctx = ctx
        self.slots = [Slot(i) for i in range(ctx.params.n_seq_max)]
        self.eog_ids = np.array(sorted(eog_ids), dtype=np.int64)
        self.max_queue = max_queue
        self.metrics = EngineMetrics()
        self.spec = spec
        #: Where a slot's cache goes before another request overwrites it (None: off).
        self.prompt_store = PromptStore(prompt_store_bytes) if prompt_store_bytes > 0 else None
        self._queue: deque[Task] = deque()
        self._controls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._next_task_id = 0

    # -- public API (any thread) ------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="tessera-slots", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel queued and running requests, wait for the loop to end."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def submit(self, request: GenerationRequest, on_event: Callable[[Any], None]) -> Task:
        """Queue ``request``; ``on_event`` gets its events on the engine thread.

        Raises :class:`ContextOverflowError` for a prompt that cannot fit and
        :class:`EngineBusyError` when the wait queue is full.
        """
        self._validate(request)
        with self._cv:
            idle = sum(1 for s in self.slots if s.task is None)
            if len(self._queue) >= self.max_queue + idle:
                self.metrics.requests_rejected += 1
                raise EngineBusyError(
                    f"all {len(self.slots)} slots are busy and {len(self._queue)} requests are "
                    "waiting; retry later or start the server with more slots (-np)"
                )
            task = Task(self._next_task_id, request, on_event)
            self._next_task_id += 1
            self.metrics.requests_total += 1
            self._queue.append(task)
            self._cv.notify_all()
        return task

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn`` on the engine thread between two steps and return its result."""
        if self._thread is None:
            return fn()
        future: Future = Future()
        with self._cv:
            self._controls.append((fn, future))
            self._cv.notify_all()
        return future.result(timeout)

    @property
    def n_queued(self) -> int:
        return len(self._queue)

    def slots_info(self) -> list[dict[str, Any]]:
        return [
            {
                "id": s.id,
                "state": s.state,
                "is_processing": s.task is not None,
                "id_task": None if s.task is None else s.task.id,
                "n_cached_tokens": len(s.cache_tokens),
                "n_prompt": len(s.prompt) if s.task else 0,
                "n_generated": s.n_generated if s.task else 0,
            }
            for s in self.slots
        ]

    def save_slot(self, id_slot: int, path: Path) -> dict[str, Any]:
        """Write slot ``id_slot``'s cached tokens and K/V to ``path`` (atomically)."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "saved")
            t0 = time.perf_counter()
            self.ctx.save_state(path, seq_id=slot.id, tokens=slot.cache_tokens)
            return {
                "id_slot": slot.id,
                "filename": path.name,
                "n_saved": len(slot.cache_tokens),
                "n_written": path.stat().st_size,
                "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
            }

        return self.call(work)

    def restore_slot(self, id_slot: int, path: Path) -> dict[str, Any]:
        """Replace slot ``id_slot``'s cache with the state saved in ``path``."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "restored")
            if not path.is_file():
                raise SlotNotFoundError(f"no slot file named {path.name!r}; save one first")
            t0 = time.perf_counter()
            tokens = self.ctx.load_state(path, seq_id=slot.id)
            slot.cache_tokens = list(tokens)
            slot.last_used = time.monotonic()
            return {
                "id_slot": slot.id,
                "filename": path.name,
                "n_restored": len(tokens),
                "n_read": path.stat().st_size,
                "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
            }

        return self.call(work)

    def erase_slot(self, id_slot: int) -> dict[str, Any]:
        """Drop slot ``id_slot``'s cached tokens and free their cells."""

        def work() -> dict[str, Any]:
            slot = self._idle_slot(id_slot, "erased")
            n = len(slot.cache_tokens)
            self.ctx.kv.seq_rm(slot.id, 0)
            slot.cache_tokens = []
            return {"id_slot": slot.id, "n_erased": n}

        return self.call(work)

    # -- validation -------------------------------------------------------------------

    def _validate(self, request: GenerationRequest) -> None:
        n_ctx, n_prompt = self.ctx.n_ctx, len(request.prompt)
        if n_prompt == 0:
            raise TesseraError("the prompt is empty; give at least one token")
        if n_prompt >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {n_prompt} tokens but the context holds {n_ctx} (and needs "
                "room for at least one generated token); shorten the prompt or start the "
                "server with a larger context (-c)"
            )
        n_vocab = self.ctx.model.n_vocab
        if min(request.prompt) < 0 or max(request.prompt) >= n_vocab:
            raise TesseraError(f"prompt token ids must be in [0, {n_vocab})")
        if not -1 <= request.id_slot < len(self.slots):
            raise SlotError(
                f"id_slot {request.id_slot} does not exist; this server has slots "
                f"0..{len(self.slots) - 1} (or -1 for any)"
            )

    def _idle_slot(self, id_slot: int, action: str) -> Slot:
        if not 0 <= id_slot < len(self.slots):
            raise SlotNotFoundError(
                f"slot {id_slot} does not exist; this server has slots 0..{len(self.slots) - 1}"
            )
        slot = self.slots[id_slot]
        if slot.task is not None:
            raise SlotBusyError(
                f"slot {id_slot} is processing a request and cannot be {action} now; "
                "wait for it to finish"
            )
        return slot

    # -- the loop (engine thread) -----------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (
                    self._stopping
                    or self._controls
                    or any(s.task is not None for s in self.slots)
                    or (self._queue and any(s.task is None for s in self.slots))
                ):
                    self._cv.wait()
                if self._stopping:
                    break
                controls = list(self._controls)
                self._controls.clear()
            for fn, future in controls:
                try:
                    future.set_result(fn())
                except BaseException as exc:  # handed to the caller's thread
                    future.set_exception(exc)
            self._reap_cancelled()
            self._admit()
            if any(s.task is not None for s in self.slots):
                step(self)
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cv:
            queued, self._queue = list(self._queue), deque()
            controls, self._controls = list(self._controls), deque()
        for task in queued:
            self._emit(task, self._finish_event(None, task, "cancelled"))
        for slot in self.slots:
            if slot.task is not None:
                self.finish(slot, "cancelled")
        for _, future in controls:
            future.set_exception(TesseraError("the server is shutting down"))
        if self.prompt_store is not None:
            self.prompt_store.close()
        for slot in self.slots:
            if slot.spec_decoder is not None:
                slot.spec_decoder.close()

    def _reap_cancelled(self) -> None:
        for slot in self.slots:
            if slot.task is not None and slot.task.cancelled:
                self.finish(slot, "cancelled")
        with self._cv:
            gone = [t for t in self._queue if t.cancelled]
            for task in gone:
                self._queue.remove(task)
        for task in gone:
            self._emit(task, self._finish_event(None, task, "cancelled"))

    def _admit(self) -> None:
        with self._cv:
            waiting = list(self._queue)
        for task in waiting:
            slot = self._choose_slot(task.request)
            if slot is None:
                continue
            with self._cv:
                self._queue.remove(task)
            self._start(slot, task)

    def _choose_slot(self, request: GenerationRequest) -> Slot | None:
        """The requested slot; else the idle slot with the longest cached prefix of the
        prompt; else an empty one; else the one used longest ago."""
        idle = [s for s in self.slots if s.task is None]
        if request.id_slot >= 0:
            slot = self.slots[request.id_slot]
            return slot if slot.task is None else None
        if not idle:
            return None

        def rank(s: Slot) -> tuple[int, bool, float]:
            reuse = common_prefix(s.cache_tokens, request.prompt) if request.cache_prompt else 0
            return (reuse, not s.cache_tokens, -s.last_used)

        return max(idle, key=rank)

    def _start(self, slot: Slot, task: Task) -> None:
        req = task.request
        n_past = common_prefix(slot.cache_tokens, req.prompt) if req.cache_prompt else 0
        if self.prompt_store is not None and req.cache_prompt:
            n_past = self._use_prompt_store(slot, req.prompt, n_past)
        n_past = min(n_past, len(req.prompt) - 1)  # the last prompt token gives the logits
        self.ctx.kv.seq_rm(slot.id, n_past)
        del slot.cache_tokens[n_past:]
        slot.task, slot.prompt = task, req.prompt
        slot.n_done = slot.n_cached = n_past
        slot.pending, slot.n_generated = None, 0
        slot.sampler = Sampler(req.sampler)
        slot.constraint = req.constraint() if req.constraint is not None else None
        slot.history = list(req.prompt)
        slot.t_start, slot.t_first = time.perf_counter(), None
        slot.drafter = None
        # constrained or logprob requests sample token by token
        if self.spec is not None and slot.constraint is None and req.logprobs is None:
            if slot.spec_decoder is None:
                slot.spec_decoder = self.spec.create()
            params = self.spec.params
            slot.drafter = Drafter(
                slot.spec_decoder, params, req.prompt, slot.id, n_max=params.draft_max
            )
        self.metrics.n_prompt_tokens_cached += n_past

    def _use_prompt_store(self, slot: Slot, prompt: Sequence[int], n_past: int) -> int:
        """Save what the request would overwrite; restore a stored state that shares more
        of the prompt than the slot does. Returns the prefix now cached."""
        store = self.prompt_store
        if len(slot.cache_tokens) - n_past >= MIN_TOKENS:
            if store.save(self.ctx, slot.id, slot.cache_tokens):
                self.metrics.n_prompt_store_saved += 1
        entry, n_stored = store.best(prompt)
        if entry is not None and n_stored > n_past:
            tokens = store.restore(self.ctx, slot.id, entry)
            if tokens is not None:
                slot.cache_tokens = tokens
                self.metrics.n_prompt_store_restored += 1
                return common_prefix(tokens, prompt)
        return n_past

    # -- events -----------------------------------------------------------------------

    def _finish_event(self, slot: Slot | None, task: Task, reason: str, error: str | None = None):
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

    def finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        """End the slot's request with ``reason``; the slot keeps its cached tokens."""
        task = slot.task
        if task is None:
            return
        event = self._finish_event(slot, task, reason, error)
        self.metrics.requests_finished += 1
        self.metrics.t_prompt_ms += event.t_prompt_ms
        self.metrics.t_generate_ms += event.t_generate_ms
        slot.task, slot.pending, slot.constraint, slot.sampler = None, None, None, None
        slot.drafter = None
        slot.last_used = time.monotonic()
        self._emit(task, event)

    def emit_token(self, slot: Slot, event: TokenEvent) -> None:
        self.metrics.n_tokens_predicted += 1
        self._emit(slot.task, event)

    def _emit(self, task: Task, event: Any) -> None:
        try:
            task.on_event(event)
        except Exception:  # a broken consumer must not stop the other slots
            log.exception("event callback of task %d failed; cancelling it", task.id)
            task.cancel()

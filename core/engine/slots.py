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
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any

import numpy as np

from tessera.engine.admission import Admission
from tessera.engine.context import Context
from tessera.engine.progress import PromptProgress
from tessera.engine.prompt_cache import PromptStore
from tessera.engine.scheduler import Event, Finish, Scheduler
from tessera.engine.slot_failures import SlotFailures
from tessera.engine.slot_files import SlotFiles
from tessera.engine.slot_types import (
    EngineBusyError,
    EngineMetrics,
    GenerationRequest,
    Slot,
    SlotSpec,
    Task,
    TokenEvent,
    finish_event,
    validate_request,
)
from tessera.errors import TesseraError

log = logging.getLogger("tessera.slots")


class SlotEngine(SlotFiles, Admission, SlotFailures):
    """Runs requests in the slots of ``ctx`` on one background thread."""

    def __init__(
        self,
        ctx: Context,
        eog_ids: Collection[int] = (),
        max_queue: int = 64,
        prompt_store_bytes: int = 0,
        spec: SlotSpec | None = None,
        stall_after_s: float = 600.0,
    ) -> None:
        self.ctx = ctx
        self.slots = [Slot(i) for i in range(ctx.params.n_seq_max)]
        self.eog_ids = np.array(sorted(eog_ids), dtype=np.int64)
        self.max_queue = max_queue
        self.metrics = EngineMetrics()
        self.scheduler = Scheduler(ctx, self.eog_ids, self.metrics)
        self.spec = spec
        #: Where a slot's cache goes before another request overwrites it (None: off).
        self.prompt_store = PromptStore(prompt_store_bytes) if prompt_store_bytes > 0 else None
        self._queue: deque[Task] = deque()
        self._controls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._next_task_id = 0
        #: Why the engine thread stopped (None while it runs); see :meth:`health`.
        self.failure: str | None = None
        #: Seconds a step may take while requests run before :meth:`health` says stalled.
        self.stall_after_s = stall_after_s
        self._last_progress = time.monotonic()

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
        validate_request(request, self.ctx.n_ctx, self.ctx.model.n_vocab, len(self.slots))
        if self.failure is not None:
            raise EngineBusyError(f"the engine has stopped ({self.failure}); restart the server")
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
        return [s.info() for s in self.slots]

    # -- the loop (engine thread) -----------------------------------------------------

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # a bug in the loop itself: say so, fail what it held
            log.exception("the slot engine's loop stopped")
            self.failure = f"{type(exc).__name__}: {exc}"
            self._shutdown("error", f"the engine stopped: {self.failure}")
            return
        self._shutdown()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not (
                    self._stopping
                    or self._controls
                    or any(s.task is not None for s in self.slots)
                    or (self._queue and any(s.task is None for s in self.slots))
                ):
                    self._cv.wait()
                # progress is counted from here: time spent idle is not a stall
                self._last_progress = time.monotonic()
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
                try:
                    self._step()
                except Exception as exc:  # a request's work raised: fail those it touched
                    ids = [s.task.id for s in self.slots if s.task is not None]
                    log.exception("a decode step of requests %s failed", ids)
                    for slot in self.slots:
                        if slot.task is not None:
                            self._drop(slot, f"generation failed: {type(exc).__name__}: {exc}")
            self._last_progress = time.monotonic()

    def _step(self) -> None:
        """One decode step over every busy slot."""
        plan = self.scheduler.schedule(self.slots)
        self._apply(plan.events)
        if plan.batch is None:
            return
        try:
            logits = self.ctx.decode(plan.batch)
        except Exception as exc:  # the cache is unchanged (decode releases its cells)
            log.exception("decode failed")
            for slot in plan.slots:
                self.finish(slot, "error", f"decoding failed: {exc}")
            return
        self._apply(self.scheduler.postprocess(plan, logits))

    def _apply(self, events: list[Event]) -> None:
        for slot, event in events:
            if isinstance(event, Finish) and event.drop_cache:
                self._drop(slot, event.error or "generation failed")
            elif isinstance(event, Finish):
                self.finish(slot, event.reason, event.error)
            elif isinstance(event, PromptProgress):
                self._emit(slot.task, event)
            else:
                self.emit_token(slot, event)

    def _end_all(self, reason: str, error: str | None) -> None:
        """End every queued and running request with ``reason`` (engine thread)."""
        with self._cv:
            queued, self._queue = list(self._queue), deque()
        for task in queued:
            self._emit(task, finish_event(None, task, reason, error))
        for slot in self.slots:
            if slot.task is not None:
                self.finish(slot, reason, error)

    def _shutdown(self, reason: str = "cancelled", error: str | None = None) -> None:
        """End every queued and running request with ``reason`` and fail pending calls."""
        self._end_all(reason, error)
        with self._cv:
            controls, self._controls = list(self._controls), deque()
        for _, future in controls:
            future.set_exception(TesseraError(error or "the server is shutting down"))
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
            self._emit(task, finish_event(None, task, "cancelled"))

    def _admit(self) -> None:
        with self._cv:
            waiting = list(self._queue)
        for task in waiting:
            slot = self._choose_slot(task.request)
            if slot is None:
                continue
            with self._cv:
                self._queue.remove(task)
            try:
                self._start(slot, task)
            except Exception as exc:  # this request alone cannot start
                log.exception("request %d could not start", task.id)
                self.ctx.kv.seq_rm(slot.id, 0)  # _start may have changed the slot's cells
                slot.task, slot.cache_tokens, slot.pending, slot.drafter = None, [], None, None
                error = f"the request could not start: {type(exc).__name__}: {exc}"
                self._emit(task, finish_event(None, task, "error", error))

    # -- events -----------------------------------------------------------------------

    def finish(self, slot: Slot, reason: str, error: str | None = None) -> None:
        """End the slot's request with ``reason``; the slot keeps its cached tokens."""
        task = slot.task
        if task is None:
            return
        event = finish_event(slot, task, reason, error)
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

"""What the slot engine does when something goes wrong: a request that fails is dropped
with its cells, a shutdown cuts what is still running, and :meth:`SlotFailures.health`
tells a watchdog whether the engine thread is dead or stalled.

:class:`SlotFailures` is that part of :class:`tessera.engine.slots.SlotEngine`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tessera.engine.context import Context
from tessera.engine.slot_types import Slot
from tessera.errors import TesseraError


class SlotFailures:
    """Failure handling and health (mixed into the slot engine)."""

    ctx: Context
    slots: list[Slot]
    failure: str | None
    stall_after_s: float
    _last_progress: float
    call: Callable[..., Any]
    finish: Callable[..., None]
    _end_all: Callable[[str, str | None], None]

    def health(self) -> tuple[bool, str]:
        """``(ok, reason)``: not ok when the engine thread has died, or has held work
        without a step for longer than ``stall_after_s`` (a watchdog reads this)."""
        if self.failure is not None:
            return False, f"the engine thread stopped: {self.failure}"
        busy = sum(1 for s in self.slots if s.task is not None)
        stalled = time.monotonic() - self._last_progress
        if busy and stalled > self.stall_after_s:
            return False, f"no decode step for {stalled:.0f} s with {busy} request(s) running"
        return True, "ok"

    def _drop(self, slot: Slot, error: str) -> None:
        """End the slot's request with ``error`` and free its cells: after a failure its
        cache may not match its tokens."""
        self.ctx.kv.seq_rm(slot.id, 0)
        slot.cache_tokens = []
        self.finish(slot, "error", error)

    def cancel_all(self, error: str) -> None:
        """End every queued and running request now (reason ``cancelled``, with ``error``
        saying why), e.g. when a shutdown's grace period is over; safe from any thread."""

        try:
            self.call(lambda: self._end_all("cancelled", error), timeout=30)
        except TesseraError:  # the loop already stopped: nothing is running
            pass

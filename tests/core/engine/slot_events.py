"""The slot engine tests' event sink: a request's tokens and its FinishEvent."""

from __future__ import annotations

import queue

from tessera.engine.slot_types import FinishEvent


class Collector:
    """An ``on_event`` callback that keeps the events; ``wait`` returns (tokens, finish)."""

    def __init__(self):
        self.events = queue.Queue()

    def __call__(self, event):
        self.events.put(event)

    def wait(self, timeout=120):
        tokens = []
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, FinishEvent):
                return tokens, event
            tokens.append(event.token)

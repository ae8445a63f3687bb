"""Prompt progress: how much of a request's prompt the slot engine has read.

A request with ``report_progress`` gets a :class:`PromptProgress` event when it starts in
a slot (``processed == cache``: only the reused prefix) and after each prompt chunk is
decoded, the last one with ``processed == total`` (llama-server's ``prompt_progress``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from tessera.engine.slot_types import Slot


@attrs.frozen
class PromptProgress:
    """Prompt tokens in all, reused from the cache, in the cache now, and the time since
    the request started in its slot."""

    total: int
    cache: int
    processed: int
    time_ms: float


def prompt_progress(slot: Slot) -> PromptProgress:
    """The progress of the request now running in ``slot``."""
    elapsed = (time.perf_counter() - slot.t_start) * 1e3
    return PromptProgress(len(slot.prompt), slot.n_cached, slot.n_done, elapsed)

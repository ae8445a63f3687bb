"""Admission: which idle slot a request gets, and starting it there.

A request goes to the slot it names, else the idle slot whose cached tokens share the
longest prefix with its prompt (the prompt cache), else an empty one, else the one used
longest ago. Starting it keeps the shared prefix's cells, consults the prompt store (states
of earlier prompts kept beside the slots), and sets up its sampler, constraint and
drafter. :class:`Admission` is that part of :class:`tessera.engine.slots.SlotEngine`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tessera.engine.context import Context
from tessera.engine.drafting import Drafter
from tessera.engine.progress import prompt_progress
from tessera.engine.prompt_cache import MIN_TOKENS, PromptStore, common_prefix
from tessera.engine.sampling import Sampler
from tessera.engine.slot_types import EngineMetrics, GenerationRequest, Slot, SlotSpec, Task


class Admission:
    """Choose a slot for a request and start it (mixed into the slot engine)."""

    ctx: Context
    slots: list[Slot]
    spec: SlotSpec | None
    prompt_store: PromptStore | None
    metrics: EngineMetrics
    _emit: Any

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
        if not self.ctx.kv.seq_rm(slot.id, n_past):  # a recurrent state holds more
            self.ctx.kv.seq_rm(slot.id)
            n_past = 0
        del slot.cache_tokens[n_past:]
        slot.task, slot.prompt = task, req.prompt
        task.id_slot = slot.id
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
        if req.report_progress:  # the first report: only the reused prefix is in the cache
            self._emit(task, prompt_progress(slot))

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

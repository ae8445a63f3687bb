"""The slot scheduler: which rows of which slots the next decode step carries, and what
its logits mean for each slot.

One step of the slot engine is ``plan = scheduler.schedule(slots)``, then
``logits = ctx.decode(plan.batch)``, then ``events = scheduler.postprocess(plan, logits)``.
The scheduler moves the slots' decoding state along (cached tokens, pending token,
history) and frees cells in the KV cache; it never calls the engine: a request that ends
is a :class:`Finish` in the events, which the engine applies.

Batch order: each generating slot's pending token (one row, with output), then prompt
chunks of the slots still reading their prompt, oldest request first, until ``n_batch``
rows. A prompt chunk asks for an output only on the prompt's last token, so the logits
buffer holds one row per slot that samples this step.

With speculative decoding on, a generating slot's rows are ``[pending, d_1 .. d_k]``
(its drafter's proposal), all with outputs; :func:`tessera.engine.verify.accept_draft`
keeps the prefix the target agrees with plus one token of its own, and the cells of the
rejected drafts leave the cache (recurrent states are put back and the kept rows evaluated
again, in one batch: :mod:`tessera.engine.draft_rollback`), so the slot ends exactly as
plain decoding would leave it. Requests with a JSON constraint or logprobs are decoded plainly.

When the unified cache cannot hold the step's new rows, drafts are dropped, then idle
slots give up their cached tokens (least recently used first); then prompt chunks
shrink; a generating slot that still cannot get a cell ends with
``finish_reason = "length"``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import attrs
import numpy as np

from tessera.contract.spec import Draft
from tessera.engine.batch import Batch
from tessera.engine.draft_rollback import KeptRows, checkpoint, keep_rows
from tessera.engine.logprobs import token_event
from tessera.engine.progress import PromptProgress, prompt_progress
from tessera.engine.slot_types import TokenEvent
from tessera.engine.verify import NO_DRAFT, accept_draft

if TYPE_CHECKING:
    from tessera.engine.context import Context
    from tessera.engine.slot_types import EngineMetrics, Slot

log = logging.getLogger("tessera.slots")


@attrs.frozen
class Finish:
    """The end of a slot's request, for the engine to apply."""

    reason: str
    error: str | None = None
    #: The request failed: free the slot's cells too (its cache may not match its tokens).
    drop_cache: bool = False


def _failed(exc: Exception) -> Finish:
    return Finish("error", f"generation failed: {type(exc).__name__}: {exc}", drop_cache=True)


#: What a step tells the engine, in order: a token or prompt progress to report, or a
#: request's end.
Event = tuple["Slot", "TokenEvent | PromptProgress | Finish"]


@attrs.define
class _Entry:
    slot: Slot
    tokens: list[int]
    output: bool  # logits for the last row (prompt chunks, plain decode)
    draft: Draft = NO_DRAFT  # logits for every row: [pending, *draft.tokens]


@attrs.define
class Plan:
    """One decode step: the batch (None: nothing to decode) and the slots' parts of it,
    plus the requests planning had to end (no room in the cache)."""

    batch: Batch | None
    entries: list[_Entry]
    events: list[Event]
    #: The drafting slots' recurrent states before the step (:func:`checkpoint`).
    saved: dict[int, object] = attrs.Factory(dict)
    #: What each verified slot keeps of its rows, rolled back after the step.
    kept: list[KeptRows] = attrs.Factory(list)

    @property
    def slots(self) -> list[Slot]:
        return [e.slot for e in self.entries]


class Scheduler:
    """Plans the decode steps of the slots over one context's unified KV cache."""

    def __init__(self, ctx: Context, eog_ids: np.ndarray, metrics: EngineMetrics) -> None:
        self.ctx = ctx
        self.eog_ids = eog_ids
        self.metrics = metrics

    # -- planning ---------------------------------------------------------------------

    def schedule(self, slots: list[Slot]) -> Plan:
        """The next step's batch over every busy slot."""
        events: list[Event] = []
        entries = self._plan(slots, events)
        if not entries:
            return Plan(None, [], events)
        rows = [
            (tok, len(e.slot.cache_tokens) + i, e.slot.id, bool(e.draft) or (e.output and last))
            for e in entries
            for i, tok in enumerate(e.tokens)
            for last in [i == len(e.tokens) - 1]
        ]
        tokens, positions, seq_ids, output = (list(col) for col in zip(*rows, strict=True))
        saved = checkpoint(self.ctx, [e.slot.id for e in entries if e.draft])
        return Plan(Batch(tokens, positions, seq_ids, output), entries, events, saved)

    def _plan(self, slots: list[Slot], events: list[Event]) -> list[_Entry]:
        kv = self.ctx.kv
        budget = self.ctx.params.n_batch
        generating = [s for s in slots if s.task is not None and s.pending is not None]
        reading = sorted(
            (s for s in slots if s.task is not None and s.pending is None),
            key=lambda s: s.task.id,
        )
        want = len(generating) + sum(len(s.prompt) - s.n_done for s in reading)
        free = kv.n_ctx - kv.n_used
        if want > free:
            free += self._evict_idle_caches(slots, min(want, budget) - free)
        while len(generating) > free:  # nothing else can give cells back: end the biggest
            biggest = max(generating, key=lambda s: len(s.cache_tokens))
            generating.remove(biggest)
            events.append((biggest, Finish("length")))
        plan = [_Entry(s, [s.pending], True) for s in generating]
        room = min(budget, free) - len(plan)
        for entry in plan:  # drafts take what room is left after one row per slot
            if room > 0 and entry.slot.drafter is not None:
                try:
                    entry.draft = self._draft(entry.slot, room)
                except Exception as exc:  # a drafter that raises fails its request alone
                    log.exception("request %d: drafting failed", entry.slot.task.id)
                    events.append((entry.slot, _failed(exc)))
                    continue
                entry.tokens += entry.draft.tokens
                room -= len(entry.draft)
        failed = {id(slot) for slot, _ in events}
        plan = [e for e in plan if id(e.slot) not in failed]
        for slot in reading:
            if room <= 0:
                break
            chunk = list(slot.prompt[slot.n_done : slot.n_done + room])
            plan.append(_Entry(slot, chunk, slot.n_done + len(chunk) == len(slot.prompt)))
            room -= len(chunk)
        if not plan and reading:  # every cell belongs to prompts still being read
            error = "the KV cache is full; raise the context (-c)"
            events.append((reading[-1], Finish("length", error)))
        return plan

    def _draft(self, slot: Slot, room: int) -> Draft:
        """The drafter's proposal for ``slot``, within ``room`` rows, the context and
        max_tokens."""
        req = slot.task.request
        room = min(room, self.ctx.n_ctx - len(slot.cache_tokens) - 2)
        if req.max_tokens >= 0:
            room = min(room, req.max_tokens - slot.n_generated - 1)
        return slot.drafter.propose(slot.history, room)

    def _evict_idle_caches(self, slots: list[Slot], n_cells: int) -> int:
        """Free at least ``n_cells`` cells from idle slots' caches, oldest first; return
        how many."""
        kv, freed = self.ctx.kv, 0
        for slot in sorted(slots, key=lambda s: s.last_used):
            if freed >= n_cells:
                break
            if slot.task is None and slot.cache_tokens:
                before = kv.n_used
                kv.seq_rm(slot.id, 0)
                slot.cache_tokens = []
                freed += before - kv.n_used
        return freed

    # -- after the decode ---------------------------------------------------------------

    def postprocess(self, plan: Plan, logits: np.ndarray) -> list[Event]:
        """Sample (or verify drafts) from the step's ``logits``; the events, in order."""
        assert plan.batch is not None
        self.metrics.n_decode_calls += 1
        self.metrics.n_batch_rows += len(plan.batch)
        events: list[Event] = []
        out_row = 0
        for e in plan.entries:
            n_rows = len(e.tokens) if e.draft else int(e.output)
            try:  # a request whose sampling raises (bad settings, a broken constraint) fails alone
                self._after_decode(e, logits[out_row : out_row + n_rows], events, plan.kept)
            except Exception as exc:
                log.exception("request %d failed after the decode", e.slot.task.id)
                events.append((e.slot, _failed(exc)))
            out_row += n_rows
        keep_rows(self.ctx, plan.saved, plan.kept)
        return events

    def _after_decode(
        self, e: _Entry, rows: np.ndarray, events: list[Event], kept: list[KeptRows]
    ) -> None:
        slot = e.slot
        if e.draft:
            self._verify(slot, e, rows, events, kept)
            return
        slot.cache_tokens.extend(e.tokens)
        if slot.pending is None:
            slot.n_done += len(e.tokens)
            self.metrics.n_prompt_tokens += len(e.tokens)
            if slot.task.request.report_progress:
                events.append((slot, prompt_progress(slot)))
        else:
            slot.pending = None
        if e.output:
            self._sample(slot, rows[0], events)

    def _verify(
        self, slot: Slot, entry: _Entry, rows: np.ndarray, events: list[Event], kept: list[KeptRows]
    ) -> None:
        """Keep the drafted tokens the target agrees with; the rest leave the cache after
        the step (``kept``)."""
        draft = entry.draft
        start = len(slot.cache_tokens)  # position of the pending token
        tokens = accept_draft(draft, self._adjusted(slot, rows), slot.sampler, slot.history)
        n_accepted = len(tokens) - 1
        slot.cache_tokens.extend(entry.tokens[: n_accepted + 1])
        kept.append(KeptRows(slot.id, entry.tokens, start, n_accepted + 1))
        slot.pending = None
        self.metrics.n_drafted += len(draft)
        self.metrics.n_draft_accepted += n_accepted
        slot.drafter.verified(len(draft), n_accepted)
        for token in tokens:
            if not self._emit(slot, TokenEvent(token), events):
                return
        slot.drafter.accepted(slot.history, len(draft), n_accepted)

    def _adjusted(self, slot: Slot, logits: np.ndarray) -> np.ndarray:
        """Logits (a row or rows) with the request's logit_bias and ignore_eos applied."""
        req = slot.task.request
        if not req.logit_bias and not (req.ignore_eos and len(self.eog_ids)):
            return logits
        logits = logits.copy()
        for token, bias in req.logit_bias:
            logits[..., token] += bias
        if req.ignore_eos:
            logits[..., self.eog_ids] = -np.inf
        return logits

    def _sample(self, slot: Slot, row: np.ndarray, events: list[Event]) -> None:
        req = slot.task.request
        logits = self._adjusted(slot, row)
        if slot.constraint is not None:
            token = slot.constraint.sample(slot.sampler, logits, slot.history)
            slot.constraint.accept(token)
        else:
            token = slot.sampler.sample(logits, slot.history)
        event = TokenEvent(token) if req.logprobs is None else token_event(row, token, req.logprobs)
        self._emit(slot, event, events)

    def _emit(self, slot: Slot, event: TokenEvent, events: list[Event]) -> bool:
        """Report a sampled token (or end the request on it); True while the request
        goes on."""
        if slot.t_first is None:
            slot.t_first = time.perf_counter()
        req = slot.task.request
        if event.token in self.eog_ids:
            events.append((slot, Finish("stop")))
            return False
        slot.n_generated += 1
        slot.history.append(event.token)
        slot.pending = event.token
        events.append((slot, event))
        if slot.constraint is not None and slot.constraint.complete:
            events.append((slot, Finish("stop")))
        elif 0 <= req.max_tokens <= slot.n_generated:
            events.append((slot, Finish("length")))
        elif len(slot.cache_tokens) + 1 >= self.ctx.n_ctx:
            events.append((slot, Finish("length")))
        else:
            return True
        return False

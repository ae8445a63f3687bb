"""One step of the slot engine: build a batch from the busy slots, decode it, sample.

Batch order: each generating slot's pending token (one row, with output), then prompt
chunks of the slots still reading their prompt, oldest request first, until ``n_batch``
rows. A prompt chunk asks for an output only on the prompt's last token, so the logits
buffer holds one row per slot that samples this step.

With speculative decoding on, a generating slot's rows are ``[pending, d_1 .. d_k]``
(its drafter's proposal), all with outputs; :func:`tessera.engine.verify.accept_draft`
keeps the prefix the target agrees with plus one token of its own, and the cells of the
rejected drafts leave the cache, so the slot ends exactly as plain decoding would leave
it. Requests with a JSON constraint or logprobs are decoded plainly.

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
from tessera.engine.slot_types import TokenEvent
from tessera.engine.verify import NO_DRAFT, accept_draft

if TYPE_CHECKING:
    from tessera.engine.slots import Slot, SlotEngine

log = logging.getLogger("tessera.slots")


@attrs.define
class _Entry:
    slot: Slot
    tokens: list[int]
    output: bool  # logits for the last row (prompt chunks, plain decode)
    draft: Draft = NO_DRAFT  # logits for every row: [pending, *draft.tokens]


def step(engine: SlotEngine) -> None:
    """Run one decode step over every busy slot of ``engine``."""
    plan = _plan(engine)
    if not plan:
        return
    rows = [
        (tok, len(e.slot.cache_tokens) + i, e.slot.id, bool(e.draft) or (e.output and last))
        for e in plan
        for i, tok in enumerate(e.tokens)
        for last in [i == len(e.tokens) - 1]
    ]
    tokens, positions, seq_ids, output = (list(col) for col in zip(*rows, strict=True))
    batch = Batch(tokens, positions, seq_ids, output)
    try:
        logits = engine.ctx.decode(batch)
    except Exception as exc:  # the cache is unchanged (decode releases its cells)
        log.exception("decode failed")
        for e in plan:
            engine.finish(e.slot, "error", f"decoding failed: {exc}")
        return
    engine.metrics.n_decode_calls += 1
    engine.metrics.n_batch_rows += len(batch)
    out_row = 0
    for e in plan:
        slot = e.slot
        if e.draft:
            n_rows = len(e.tokens)
            _verify(engine, slot, e, logits[out_row : out_row + n_rows])
            out_row += n_rows
            continue
        slot.cache_tokens.extend(e.tokens)
        if slot.pending is None:
            slot.n_done += len(e.tokens)
            engine.metrics.n_prompt_tokens += len(e.tokens)
        else:
            slot.pending = None
        if e.output:
            _sample(engine, slot, logits[out_row])
            out_row += 1


def _plan(engine: SlotEngine) -> list[_Entry]:
    kv = engine.ctx.kv
    budget = engine.ctx.params.n_batch
    generating = [s for s in engine.slots if s.task is not None and s.pending is not None]
    reading = sorted(
        (s for s in engine.slots if s.task is not None and s.pending is None),
        key=lambda s: s.task.id,
    )
    want = len(generating) + sum(len(s.prompt) - s.n_done for s in reading)
    free = kv.n_ctx - kv.n_used
    if want > free:
        free += _evict_idle_caches(engine, min(want, budget) - free)
    while len(generating) > free:  # nothing else can give cells back: end the biggest
        biggest = max(generating, key=lambda s: len(s.cache_tokens))
        generating.remove(biggest)
        engine.finish(biggest, "length")
    plan = [_Entry(s, [s.pending], True) for s in generating]
    room = min(budget, free) - len(plan)
    for entry in plan:  # drafts take what room is left after one row per slot
        if room > 0 and entry.slot.drafter is not None:
            entry.draft = _draft(engine, entry.slot, room)
            entry.tokens += entry.draft.tokens
            room -= len(entry.draft)
    for slot in reading:
        if room <= 0:
            break
        chunk = list(slot.prompt[slot.n_done : slot.n_done + room])
        plan.append(_Entry(slot, chunk, slot.n_done + len(chunk) == len(slot.prompt)))
        room -= len(chunk)
    if not plan and reading:  # every cell belongs to prompts still being read
        engine.finish(reading[-1], "length", "the KV cache is full; raise the context (-c)")
    return plan


def _draft(engine: SlotEngine, slot: Slot, room: int) -> Draft:
    """The drafter's proposal for ``slot``, within ``room`` rows, the context, max_tokens."""
    req = slot.task.request
    room = min(room, engine.ctx.n_ctx - len(slot.cache_tokens) - 2)
    if req.max_tokens >= 0:
        room = min(room, req.max_tokens - slot.n_generated - 1)
    return slot.drafter.propose(slot.history, room)


def _verify(engine: SlotEngine, slot: Slot, entry: _Entry, rows: np.ndarray) -> None:
    """Keep the drafted tokens the target agrees with, roll the rest out of the cache."""
    draft = entry.draft
    start = len(slot.cache_tokens)  # position of the pending token
    tokens = accept_draft(draft, _adjusted(engine, slot, rows), slot.sampler, slot.history)
    n_accepted = len(tokens) - 1
    slot.cache_tokens.extend(entry.tokens[: n_accepted + 1])
    engine.ctx.kv.seq_rm(slot.id, start + n_accepted + 1, start + len(entry.tokens))
    slot.pending = None
    engine.metrics.n_drafted += len(draft)
    engine.metrics.n_draft_accepted += n_accepted
    slot.drafter.verified(len(draft), n_accepted)
    for token in tokens:
        if not _emit(engine, slot, TokenEvent(token)):
            return
    slot.drafter.accepted(slot.history, len(draft), n_accepted)


def _evict_idle_caches(engine: SlotEngine, n_cells: int) -> int:
    """Free at least ``n_cells`` cells from idle slots' caches, oldest first; return how many."""
    kv, freed = engine.ctx.kv, 0
    for slot in sorted(engine.slots, key=lambda s: s.last_used):
        if freed >= n_cells:
            break
        if slot.task is None and slot.cache_tokens:
            before = kv.n_used
            kv.seq_rm(slot.id, 0)
            slot.cache_tokens = []
            freed += before - kv.n_used
    return freed


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def _adjusted(engine: SlotEngine, slot: Slot, logits: np.ndarray) -> np.ndarray:
    """Logits (a row or rows) with the request's logit_bias and ignore_eos applied."""
    req = slot.task.request
    if not req.logit_bias and not (req.ignore_eos and len(engine.eog_ids)):
        return logits
    logits = logits.copy()
    for token, bias in req.logit_bias:
        logits[..., token] += bias
    if req.ignore_eos:
        logits[..., engine.eog_ids] = -np.inf
    return logits


def _sample(engine: SlotEngine, slot: Slot, row: np.ndarray) -> None:
    req = slot.task.request
    logits = _adjusted(engine, slot, row)
    if slot.constraint is not None:
        token = slot.constraint.sample(slot.sampler, logits, slot.history)
        slot.constraint.accept(token)
    else:
        token = slot.sampler.sample(logits, slot.history)
    event = TokenEvent(token)
    if req.logprobs is not None:
        logp = _log_softmax(row)
        top = np.argsort(-logp, kind="stable")[: req.logprobs]
        event = TokenEvent(token, float(logp[token]), tuple((int(t), float(logp[t])) for t in top))
    _emit(engine, slot, event)


def _emit(engine: SlotEngine, slot: Slot, event: TokenEvent) -> bool:
    """Report a sampled token (or end the request on it); True while the request goes on."""
    if slot.t_first is None:
        slot.t_first = time.perf_counter()
    req = slot.task.request
    if event.token in engine.eog_ids:
        engine.finish(slot, "stop")
        return False
    slot.n_generated += 1
    slot.history.append(event.token)
    slot.pending = event.token
    engine.emit_token(slot, event)
    if slot.constraint is not None and slot.constraint.complete:
        engine.finish(slot, "stop")
    elif 0 <= req.max_tokens <= slot.n_generated:
        engine.finish(slot, "length")
    elif len(slot.cache_tokens) + 1 >= engine.ctx.n_ctx:
        engine.finish(slot, "length")
    else:
        return True
    return False

"""Speculative generation: a drafter proposes tokens, the target checks them in one batch.

Each step evaluates ``[last token, d_1 .. d_k]`` on the target in one batch, with logits
for every row. Row ``j`` is the target's distribution for the token after ``d_j`` (row 0:
after the last token). Acceptance, token by token (Leviathan et al. / Chen et al. 2023):

- greedy: keep ``d_j`` while it equals the target's argmax; the first mismatch is replaced
  by the argmax, so the output is token for token what the target alone would give;
- sampling: keep ``d_j`` with probability ``min(1, p(d_j) / q(d_j))`` (``p``: the target's
  sampling distribution after penalties/top-k/top-p/min-p/temperature, ``q``: the
  drafter's); on rejection draw from ``max(p - q, 0)`` renormalized. The emitted tokens
  are then distributed exactly as the target's own samples.

After a full acceptance the last row gives one more token for free. Rejected rows leave
the target's KV cache with ``KVCache.seq_rm``, so the cache ends exactly as after plain
decoding; drafters roll their own state back (see :class:`tessera.contract.spec.SpecDecoder`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from tessera.contract.spec import Draft, SpecDecoder, SpecParams
from tessera.engine.batch import Batch
from tessera.engine.context import Context
from tessera.engine.generate import GenerationStats, check_prompt
from tessera.engine.sampling import Sampler

#: Set to 0 to draft at every step with the length fixed at --draft-max (no adaptive
#: length, no :class:`SpecGovernor`).
ADAPTIVE_ENV = "TESSERA_SPEC_ADAPTIVE"


@attrs.define
class SpecStats(GenerationStats):
    """:class:`GenerationStats` plus what speculation did (llama.cpp's n_drafted/n_accept)."""

    n_drafted: int = 0
    n_accepted: int = 0
    n_target_batches: int = 0  # target decode calls after the prompt
    n_verify: int = 0  # of those, the ones that carried a draft

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Accepted draft tokens per target batch that carried a draft."""
        return self.n_accepted / self.n_verify if self.n_verify else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "n_prompt": self.n_prompt,
            "n_generated": self.n_generated,
            "t_prompt": self.t_prompt,
            "t_generate": self.t_generate,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "n_target_batches": self.n_target_batches,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted,
        }


def accept_draft(
    draft: Draft,
    rows: np.ndarray,
    sampler: Sampler,
    history: Sequence[int],
) -> list[int]:
    """The tokens to emit for ``draft`` given target logits ``rows`` (``len(draft) + 1``
    rows): the accepted prefix of the draft followed by one token of the target's."""
    out: list[int] = []
    hist = list(history)
    for j, d in enumerate(draft.tokens):
        if sampler.params.greedy:
            t = sampler.sample(rows[j], hist)
            if t != d:
                return [*out, t]
        else:
            p = sampler.probs(rows[j], hist)
            q_d = 1.0 if draft.probs is None else float(draft.probs[j][d])
            # accept d with probability min(1, p(d) / q(d))
            if sampler.rng.random() * q_d >= p[d]:
                residual = p.copy()
                if draft.probs is None:
                    residual[d] = 0.0
                else:
                    residual = np.maximum(p - draft.probs[j], 0.0)
                total = residual.sum()
                residual = residual / total if total > 0 else p
                return [*out, int(sampler.rng.choice(len(residual), p=residual))]
        out.append(d)
        hist.append(d)
    return [*out, sampler.sample(rows[len(draft)], hist)]


@attrs.define
class DraftLength:
    """How many tokens to ask for next: grows while drafts are accepted, shrinks on
    rejection, and after repeated total misses pauses drafting for a growing stretch."""

    n_max: int
    adaptive: bool = True
    n: int = 0
    pause: int = 0  # plain steps left before drafting again
    backoff: int = 1

    def __attrs_post_init__(self) -> None:
        self.n = self.n_max

    def next(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.n

    def update(self, n_drafted: int, n_accepted: int) -> None:
        if not self.adaptive or n_drafted == 0:
            return
        if n_accepted == n_drafted:
            self.n = min(self.n_max, self.n * 2)
            self.backoff = 1
        elif n_accepted == 0 and self.n == 1:
            self.pause, self.backoff = self.backoff, min(self.backoff * 2, 16)
        else:
            self.n = max(1, n_accepted + 1)


@attrs.define
class SpecGovernor:
    """Drafts only while drafting pays, measured in seconds per emitted token.

    Acceptance alone cannot tell: a drafter that is right 60% of the time still loses when
    drafting and verifying cost more than the tokens it saves. The governor keeps moving
    averages of the wall time of plain steps (no draft, one token each) and of the time and
    the tokens of speculative steps (draft + verify + the drafter's bookkeeping; a step
    whose drafter proposed nothing counts too), so that their ratio is the recent seconds
    per token of speculation: a ratio of averages, since a few long accepted drafts are
    what pays for many short ones. While speculation is clearly slower per token (by
    ``margin``, after ``min_evidence`` speculative steps) it drafts only in probes,
    separated by a stretch of plain steps that doubles after each losing probe (up to
    ``max_off``); a winning step resets the stretch. It starts with ``n_calibrate`` plain
    steps, and re-times plain decoding every ``replain_every`` speculative steps so the
    comparison follows load changes. The loop keeps it on the decoder
    (:attr:`SpecDecoder.governor`), so its timings carry over generations; a new
    generation probes again within ``restart_off`` steps. Like the adaptive length it
    governs drafters whose drafting costs time, not lookups (``cheap_drafts``).
    """

    enabled: bool = True
    n_calibrate: int = 2
    replain_every: int = 32
    max_off: int = 128
    restart_off: int = 16
    #: Pause only when speculation is this much slower per token (timings are noisy) ...
    margin: float = 0.1
    #: ... and only after this many speculative steps have been timed.
    min_evidence: int = 3
    alpha: float = 0.25  # weight of the newest step in the moving averages
    t_plain: float | None = None  # seconds per plain step (= per token)
    s_spec: float | None = None  # seconds per speculative step
    n_spec: float | None = None  # tokens per speculative step
    n_plain: int = 0
    n_spec_steps: int = 0
    since_plain: int = 0
    off: int = 0  # plain steps left before the next probe
    stretch: int = 2

    def begin(self) -> None:
        """A new generation: keep the timings, but probe again within ``restart_off``
        steps (a drafter that lost on one text, such as a lookup, may win on the next)."""
        self.off = min(self.off, self.restart_off)
        self.stretch = min(self.stretch, 2 * self.restart_off)

    def allow(self) -> bool:
        """Whether the next step may carry a draft."""
        if not self.enabled:
            return True
        if self.n_plain < self.n_calibrate or self.since_plain >= self.replain_every:
            return False
        if self.off > 0:
            self.off -= 1
            return False
        return True

    def record(self, drafted: bool, seconds: float, n_emitted: int) -> None:
        """One step took ``seconds`` and emitted ``n_emitted`` tokens."""
        if not drafted:
            self.t_plain = _ema(self.t_plain, seconds / max(n_emitted, 1), self.alpha)
            self.n_plain += 1
            self.since_plain = 0
            return
        self.since_plain += 1
        self.s_spec = _ema(self.s_spec, seconds, self.alpha)
        self.n_spec = _ema(self.n_spec, n_emitted, self.alpha)
        self.n_spec_steps += 1
        losing = self.t_plain is not None and self.t_spec > self.t_plain * (1 + self.margin)
        if losing and self.n_spec_steps >= self.min_evidence:
            self.off, self.stretch = self.stretch, min(self.stretch * 2, self.max_off)
        else:
            self.stretch = 2

    @property
    def t_spec(self) -> float:
        """Recent seconds per token of speculative steps (inf before any token)."""
        return self.s_spec / self.n_spec if self.s_spec is not None and self.n_spec else math.inf

    @property
    def speedup(self) -> float:
        """Measured plain / speculative time per token (0 before both are known)."""
        return self.t_plain / self.t_spec if self.t_plain else 0.0


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


def generate_speculative(
    ctx: Context,
    prompt: Sequence[int],
    n_predict: int,
    sampler: Sampler,
    decoder: SpecDecoder,
    params: SpecParams | None = None,
    *,
    seq_id: int = 0,
    eog_ids: frozenset[int] = frozenset(),
    stats: SpecStats | None = None,
    n_past: int = 0,
    on_prompt_done: Callable[[], None] | None = None,
) -> Iterator[int]:
    """Like :func:`tessera.engine.generate.generate` (same arguments, same tokens for greedy
    sampling, same distribution otherwise), with ``decoder`` drafting ahead."""
    params = params or SpecParams()
    check_prompt(ctx, prompt, n_past)
    stats = stats if stats is not None else SpecStats()
    if decoder.needs_all_prompt_outputs:
        n_past = 0  # the drafter needs every prompt row's state, so evaluate them all
    ctx.kv.seq_rm(seq_id, n_past)
    t0 = time.perf_counter()
    logits = _prefill(ctx, prompt[n_past:], seq_id, n_past, decoder.needs_all_prompt_outputs)
    stats.n_prompt, stats.t_prompt = len(prompt) - n_past, time.perf_counter() - t0
    if on_prompt_done is not None:
        on_prompt_done()
    history = list(prompt)
    budget = ctx.n_ctx - len(prompt) if n_predict < 0 else min(n_predict, ctx.n_ctx - len(prompt))
    adaptive = params.adaptive and _adaptive_env() and not decoder.cheap_drafts
    length = DraftLength(min(params.draft_max, ctx.params.n_batch - 1), adaptive)
    governor = decoder.governor
    if governor is None or governor.enabled != adaptive:
        governor = decoder.governor = SpecGovernor(enabled=adaptive)
    governor.begin()
    t0 = time.perf_counter()
    decoder.begin(prompt, seq_id)
    if budget <= 0:
        return
    token = sampler.sample(logits, history)
    stats.n_generated += 1
    if token in eog_ids:
        stats.t_generate = time.perf_counter() - t0
        return
    yield token
    history.append(token)
    n_left = budget - 1
    while n_left > 0:
        # Enough drafts to fill the budget (the target adds one) and the context.
        t_step = time.perf_counter()
        n_max = min(length.next(), n_left - 1, ctx.n_ctx - len(history))
        n_max = n_max if governor.allow() else 0
        draft = decoder.draft(history, n_max) if n_max > 0 else Draft(())
        if len(draft) > n_max:
            probs = None if draft.probs is None else draft.probs[:n_max]
            draft = Draft(draft.tokens[:n_max], probs)
        if len(draft) < max(params.draft_min, 1):
            draft = Draft(())
        pos0 = len(history) - 1
        batch = Batch.for_sequence([history[-1], *draft.tokens], pos0, seq_id, "all")
        rows = ctx.decode(batch)
        stats.n_target_batches += 1
        emitted = accept_draft(draft, rows, sampler, history)
        n_acc = len(emitted) - 1
        if len(draft):
            stats.n_drafted += len(draft)
            stats.n_accepted += n_acc
            stats.n_verify += 1
        length.update(len(draft), n_acc)
        stopped = False
        kept = 0
        for t in emitted[:n_left]:
            stats.n_generated += 1
            if t in eog_ids:
                stopped = True
                break
            kept += 1
        new = emitted[:kept]
        t_step = time.perf_counter() - t_step  # the consumer's time between yields is not ours
        # The cache keeps the history the target has evaluated: all of it after an EOG
        # (as plain decoding), else all but the newest token, which the next batch carries.
        keep_to = len(history) + kept - (0 if stopped else 1)
        ctx.kv.seq_rm(seq_id, keep_to)
        for t in new:
            yield t
        history.extend(new)
        n_left -= len(emitted[:n_left])
        stats.t_generate = time.perf_counter() - t0
        if stopped or n_left <= 0:
            break
        t_accepted = time.perf_counter()
        decoder.accepted(history, len(draft), n_acc)
        # A step that asked the drafter counts as speculative even when it proposed nothing:
        # it paid for drafting.
        governor.record(n_max > 0, t_step + time.perf_counter() - t_accepted, len(new))
    stats.t_generate = time.perf_counter() - t0


def _adaptive_env() -> bool:
    return os.environ.get(ADAPTIVE_ENV, "1") not in ("0", "")


def _prefill(
    ctx: Context, tokens: Sequence[int], seq_id: int, start_pos: int, all_rows: bool
) -> np.ndarray:
    """The prompt in n_batch chunks; the last row's logits (all rows' when a drafter
    reads the target's per-row state)."""
    if not all_rows:
        from tessera.engine.generate import prefill

        return prefill(ctx, tokens, seq_id, start_pos)
    n_batch = ctx.params.n_batch
    logits = np.zeros((0,), dtype=np.float32)
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start : start + n_batch]
        logits = ctx.decode(Batch.for_sequence(chunk, start_pos + start, seq_id, "all"))[-1]
    return logits


def create_decoder(runtime: Any, name: str, ctx: Context, params: SpecParams) -> SpecDecoder:
    """The spec decoder ``name`` from the plugin registry, bound to ``ctx``."""
    return runtime.spec_decoder(name).create(ctx, params, runtime)

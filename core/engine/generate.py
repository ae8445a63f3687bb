"""Generation on one sequence: prompt processing, then the decode loop.

One loop serves plain and speculative decoding. Each step evaluates ``[last token,
d_1 .. d_k]`` on the target in one batch and keeps what :func:`accept_draft` accepts;
plain decoding is the case of an empty draft (one row, one sampled token). With a spec
decoder, a :class:`tessera.engine.drafting.Drafter` proposes the drafts. The server's slot
scheduler builds on the same pieces (Context.decode, Sampler, accept_draft); this is the
single-sequence path used by ``tessera run`` and the tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import attrs
import numpy as np

from tessera.contract.spec import SpecDecoder, SpecParams
from tessera.engine.batch import Batch
from tessera.engine.context import Context
from tessera.engine.draft_rollback import KeptRows, checkpoint, keep_rows
from tessera.engine.drafting import Drafter
from tessera.engine.sampling import Sampler
from tessera.engine.verify import NO_DRAFT, accept_draft
from tessera.errors import ContextOverflowError, TesseraError


@attrs.define
class GenerationStats:
    """Token counts and wall times of one generation (for t/s reports), and what
    speculation did (llama.cpp's n_drafted/n_accept)."""

    n_prompt: int = 0
    n_generated: int = 0
    t_prompt: float = 0.0
    t_generate: float = 0.0
    n_drafted: int = 0
    n_accepted: int = 0
    n_target_batches: int = 0  # target decode calls after the prompt
    n_verify: int = 0  # of those, the ones that carried a draft

    @property
    def prompt_tps(self) -> float:
        return self.n_prompt / self.t_prompt if self.t_prompt else 0.0

    @property
    def generate_tps(self) -> float:
        return self.n_generated / self.t_generate if self.t_generate else 0.0

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


def prefill(
    ctx: Context,
    tokens: Sequence[int],
    seq_id: int = 0,
    start_pos: int = 0,
    all_rows: bool = False,
) -> np.ndarray:
    """Evaluate ``tokens`` in n_batch chunks; return the logits of the last one.

    ``all_rows`` asks for every row's output (a drafter that reads the target's per-row
    state, such as an MTP head, needs them)."""
    n_batch = ctx.params.n_batch
    logits = np.zeros((0,), dtype=np.float32)
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start : start + n_batch]
        is_last = start + n_batch >= len(tokens)
        outputs = "all" if all_rows else "last" if is_last else "none"
        out = ctx.decode(Batch.for_sequence(chunk, start_pos + start, seq_id, outputs))
        if is_last:
            logits = out[-1]
    return logits


def check_prompt(ctx: Context, prompt: Sequence[int], n_past: int = 0) -> None:
    """Refuse an empty prompt, one that leaves no room in the context, or a bad n_past."""
    if not 0 <= n_past < max(len(prompt), 1):
        raise TesseraError(f"n_past must be in [0, {len(prompt)}), got {n_past}")
    if not prompt:
        raise ContextOverflowError("the prompt is empty; give at least one token")
    if len(prompt) >= ctx.n_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(prompt)} tokens but the context holds {ctx.n_ctx}; raise the "
            "context size with -c or shorten the prompt"
        )


def generate(
    ctx: Context,
    prompt: Sequence[int],
    n_predict: int,
    sampler: Sampler,
    *,
    decoder: SpecDecoder | None = None,
    spec: SpecParams | None = None,
    seq_id: int = 0,
    eog_ids: frozenset[int] = frozenset(),
    stats: GenerationStats | None = None,
    n_past: int = 0,
    on_prompt_done: Callable[[], None] | None = None,
) -> Iterator[int]:
    """Yield up to ``n_predict`` sampled tokens after ``prompt`` (stops at an EOG token).

    ``n_predict < 0`` generates until the context is full or an EOG token is drawn. The
    first ``n_past`` prompt tokens are already in the cache (a restored prompt cache) and
    are not evaluated again; ``on_prompt_done`` is called once the prompt is evaluated.
    With ``decoder`` (settings ``spec``), it drafts ahead: the same tokens for greedy
    sampling, the same distribution otherwise.
    """
    check_prompt(ctx, prompt, n_past)
    stats = stats if stats is not None else GenerationStats()
    all_rows = decoder is not None and decoder.needs_all_prompt_outputs
    n_past = 0 if all_rows else n_past  # the drafter reads every prompt row's state
    if not ctx.kv.seq_rm(seq_id, n_past):  # a recurrent state holds more than n_past
        ctx.kv.seq_rm(seq_id)
        n_past = 0
    t0 = time.perf_counter()
    logits = prefill(ctx, prompt[n_past:], seq_id, n_past, all_rows)
    stats.n_prompt, stats.t_prompt = len(prompt) - n_past, time.perf_counter() - t0
    if on_prompt_done is not None:
        on_prompt_done()
    history = list(prompt)
    budget = ctx.n_ctx - len(prompt) if n_predict < 0 else min(n_predict, ctx.n_ctx - len(prompt))
    drafter = None
    t0 = time.perf_counter()
    if decoder is not None:
        spec = spec or SpecParams()
        n_max = min(spec.draft_max, ctx.params.n_batch - 1)
        drafter = Drafter(decoder, spec, prompt, seq_id, n_max=n_max, governed=True)
        drafter.begin()
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
        t_step = time.perf_counter()
        # Drafts fill at most the budget (the target adds one) and the context.
        room = min(n_left - 1, ctx.n_ctx - len(history))
        draft = NO_DRAFT if drafter is None else drafter.propose(history, room)
        rows_in = [history[-1], *draft.tokens]
        saved = checkpoint(ctx, [seq_id]) if draft.tokens else {}
        rows = ctx.decode(Batch.for_sequence(rows_in, len(history) - 1, seq_id, "all"))
        emitted = accept_draft(draft, rows, sampler, history)
        n_accepted = len(emitted) - 1
        emitted = emitted[:n_left]
        stats.n_target_batches += 1
        if draft.tokens:
            stats.n_drafted += len(draft)
            stats.n_accepted += n_accepted
            stats.n_verify += 1
        kept = next((i for i, t in enumerate(emitted) if t in eog_ids), len(emitted))
        stopped = kept < len(emitted)
        stats.n_generated += kept + stopped
        t_step = time.perf_counter() - t_step  # the consumer's time between yields is not ours
        if draft.tokens:
            # The cache keeps what the target evaluated: all of it after an EOG (as plain
            # decoding), else all but the newest token, which the next batch carries.
            n_keep = kept + (1 if stopped else 0)
            keep_rows(ctx, saved, [KeptRows(seq_id, rows_in, len(history) - 1, n_keep)])
        if drafter is not None:
            drafter.verified(len(draft), n_accepted)
        new = emitted[:kept]
        yield from new
        history.extend(new)
        n_left -= len(emitted)
        stats.t_generate = time.perf_counter() - t0
        if stopped or n_left <= 0:
            break
        if drafter is not None:
            t_accepted = time.perf_counter()
            drafter.accepted(history, len(draft), n_accepted)
            drafter.timed(t_step + time.perf_counter() - t_accepted, len(new))
    stats.t_generate = time.perf_counter() - t0

"""Generation on one sequence: prompt processing, then a sample-decode loop.

The server's slot scheduler builds on the same pieces (Context.decode, Sampler); this is
the single-sequence path used by ``tessera run`` and the tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import attrs
import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context
from tessera.engine.sampling import Sampler
from tessera.errors import ContextOverflowError, TesseraError


@attrs.define
class GenerationStats:
    """Token counts and wall times of one generation (for t/s reports)."""

    n_prompt: int = 0
    n_generated: int = 0
    t_prompt: float = 0.0
    t_generate: float = 0.0

    @property
    def prompt_tps(self) -> float:
        return self.n_prompt / self.t_prompt if self.t_prompt else 0.0

    @property
    def generate_tps(self) -> float:
        return self.n_generated / self.t_generate if self.t_generate else 0.0


def prefill(ctx: Context, tokens: Sequence[int], seq_id: int = 0, start_pos: int = 0) -> np.ndarray:
    """Evaluate ``tokens`` in n_batch chunks; return the logits of the last one."""
    n_batch = ctx.params.n_batch
    logits = np.zeros((0,), dtype=np.float32)
    for start in range(0, len(tokens), n_batch):
        chunk = tokens[start : start + n_batch]
        is_last = start + n_batch >= len(tokens)
        batch = Batch.for_sequence(chunk, start_pos + start, seq_id, "last" if is_last else "none")
        out = ctx.decode(batch)
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
    """
    check_prompt(ctx, prompt, n_past)
    stats = stats if stats is not None else GenerationStats()
    ctx.kv.seq_rm(seq_id, n_past)
    t0 = time.perf_counter()
    logits = prefill(ctx, prompt[n_past:], seq_id, n_past)
    stats.n_prompt, stats.t_prompt = len(prompt) - n_past, time.perf_counter() - t0
    if on_prompt_done is not None:
        on_prompt_done()
    history = list(prompt)
    budget = ctx.n_ctx - len(prompt) if n_predict < 0 else min(n_predict, ctx.n_ctx - len(prompt))
    t0 = time.perf_counter()
    for i in range(budget):
        token = sampler.sample(logits, history)
        stats.n_generated += 1
        if token in eog_ids:
            break
        yield token
        history.append(token)
        if i + 1 < budget:
            pos = len(history) - 1
            logits = ctx.decode(Batch([token], [pos], [seq_id], [True]))[0]
        stats.t_generate = time.perf_counter() - t0
    stats.t_generate = time.perf_counter() - t0

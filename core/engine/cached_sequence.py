"""A sequence whose evaluated tokens are remembered, so a prompt that starts the same way
evaluates only what is new (the next turn of a chat, a repeated prefix).

``tessera chat`` and :class:`tessera.LLM` generate through it::

    seq = CachedSequence(ctx)
    for token in seq.generate(prompt_1, 64, sampler, eog_ids=tok.eog_ids): ...
    for token in seq.generate(prompt_2, 64, sampler, eog_ids=tok.eog_ids): ...

The second call keeps the longest common prefix of ``prompt_2`` and the tokens the cache
holds (at most all but the last prompt token, whose logits are needed to sample) and
evaluates the rest. What the cache holds is read back from the KV cache itself when a
generation ends, however it ends (finished, closed early, interrupted by Ctrl-C or an
error), so the record never claims a token the cache lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tessera.engine.context import Context
from tessera.engine.generate import GenerationStats, check_prompt, generate
from tessera.engine.sampling import Sampler


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CachedSequence:
    """Sequence ``seq_id`` of ``ctx`` and the tokens its KV cells hold, position by position."""

    def __init__(self, ctx: Context, seq_id: int = 0) -> None:
        self.ctx = ctx
        self.seq_id = seq_id
        #: The tokens at positions 0 .. len - 1 of the sequence in the cache.
        self.tokens: list[int] = []

    def reusable(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of ``prompt`` the cache already holds and may keep."""
        return min(common_prefix(self.tokens, prompt), max(len(prompt) - 1, 0))

    def generate(
        self,
        prompt: Sequence[int],
        n_predict: int,
        sampler: Sampler,
        *,
        eog_ids: frozenset[int] = frozenset(),
        stats: GenerationStats | None = None,
    ) -> Iterator[int]:
        """:func:`tessera.engine.generate.generate` after the cached prefix of ``prompt``;
        ``stats.n_prompt`` counts only the tokens evaluated. A prompt the context cannot
        take is refused here, at the call, with the cache untouched. Close the iterator (or
        let it finish) to bring the record up to date."""
        check_prompt(self.ctx, prompt)
        return self._generate(list(prompt), n_predict, sampler, eog_ids, stats)

    def _generate(
        self,
        prompt: list[int],
        n_predict: int,
        sampler: Sampler,
        eog_ids: frozenset[int],
        stats: GenerationStats | None,
    ) -> Iterator[int]:
        n_past = self.reusable(prompt)
        history = list(prompt)
        try:
            for token in generate(
                self.ctx,
                prompt,
                n_predict,
                sampler,
                seq_id=self.seq_id,
                eog_ids=eog_ids,
                stats=stats,
                n_past=n_past,
            ):
                history.append(token)
                yield token
        finally:
            # a sampled token enters the cache only when the next step evaluates it
            self.tokens = history[: self.ctx.kv.seq_pos_max(self.seq_id) + 1]

    def clear(self) -> None:
        """Drop the sequence from the cache."""
        self.ctx.kv.seq_rm(self.seq_id, 0)
        self.tokens = []

"""Qwen3-Next in the slot engine (the server's scheduler): continuous batching of several
requests over their recurrent states, the prompt cache and speculative decoding, against
the single-sequence generator (itself checked against transformers in
test_qwen3_next_parity.py)."""

from __future__ import annotations

import pytest
from qwen3_next_oracle import (
    LLAMA_CPP_F32,
    ScriptedDrafter,
    context,
    greedy,
    prompt,
    transformers_answers,
)

from tessera.contract.spec import SpecParams
from tessera.engine.sampling import SamplerParams
from tessera.engine.slot_types import GenerationRequest, SlotSpec
from tessera.engine.slots import SlotEngine

GREEDY = SamplerParams(temperature=0.0)
N = 8


class Collector:
    """An ``on_event`` callback keeping a request's tokens until its FinishEvent."""

    def __init__(self) -> None:
        import queue

        self.events: queue.Queue = queue.Queue()

    def __call__(self, event) -> None:
        self.events.put(event)

    def wait(self, timeout: float = 300):
        from tessera.engine.slot_types import FinishEvent

        tokens = []
        while not isinstance(event := self.events.get(timeout=timeout), FinishEvent):
            tokens.append(event.token)
        return tokens, event


def run(engine: SlotEngine, prompts: list[list[int]]) -> list:
    collectors = [Collector() for _ in prompts]
    for p, c in zip(prompts, collectors, strict=True):
        engine.submit(GenerationRequest(p, max_tokens=N, sampler=GREEDY), c)
    return [c.wait() for c in collectors]


@pytest.fixture
def engine():
    # n_batch 8: prompts are prefilled in pieces, in batches with the other slots' decode rows
    engine = SlotEngine(context(LLAMA_CPP_F32, "numpy", n_seq_max=2, n_batch=8))
    engine.start()
    yield engine
    engine.stop()


def test_concurrent_requests_get_the_tokens_of_sequential_runs(engine):
    prompts = [prompt(7).tolist(), prompt(8, 11).tolist(), prompt(9, 13).tolist()]
    results = run(engine, prompts)  # three requests on two slots: one waits, then reuses one
    assert results[0][0] == transformers_answers()[1]
    for p, (tokens, _) in zip(prompts, results, strict=True):
        assert tokens == greedy(context(LLAMA_CPP_F32, "numpy"), p)
    assert engine.metrics.n_decode_calls < engine.metrics.n_batch_rows  # batching happened


def test_the_prompt_cache_reuses_a_state_only_for_an_exact_prefix(engine):
    first = prompt().tolist()
    ((answer, _),) = run(engine, [first])
    # the slot holds the prompt and all but the last answer token: an exact prefix of this
    follow_up = [*first, *answer, 5, 6]
    ((tokens, finish),) = run(engine, [follow_up])
    assert finish.n_cached == len(first) + len(answer) - 1
    assert tokens == greedy(context(LLAMA_CPP_F32, "numpy"), follow_up)
    # a prompt that departs inside the held tokens cannot reuse the state: evaluated anew
    other = [*first, 9, 9]
    ((tokens, finish),) = run(engine, [other])
    assert finish.n_cached == 0 and finish.n_prompt == len(other)
    assert tokens == greedy(context(LLAMA_CPP_F32, "numpy"), other)


def test_speculative_requests_in_both_slots_get_the_tokens_of_plain_runs():
    """Two slots verify drafts in the same steps; after their rejections both states are
    put back and their kept rows evaluated again in one batch."""
    prompts = [prompt(7).tolist(), prompt(8, 11).tolist(), prompt(9, 13).tolist()]
    want = [greedy(context(LLAMA_CPP_F32, "numpy"), p) for p in prompts]
    ctx = context(LLAMA_CPP_F32, "numpy", n_seq_max=2, n_batch=8)
    known = [p + w for p, w in zip(prompts, want, strict=True)]

    def create():
        return ScriptedDrafter(known, ctx.model.config.n_vocab)

    engine = SlotEngine(ctx, spec=SlotSpec("scripted", SpecParams(draft_max=3), create))
    engine.start()
    try:
        results = run(engine, prompts)
    finally:
        engine.stop()
    assert [tokens for tokens, _ in results] == want
    assert 0 < engine.metrics.n_draft_accepted < engine.metrics.n_drafted

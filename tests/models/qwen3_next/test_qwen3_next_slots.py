"""Qwen3-Next in the slot engine (the server's scheduler): continuous batching of several
requests over their recurrent states, and the prompt cache, against the single-sequence
generator (itself checked against transformers in test_qwen3_next_parity.py)."""

from __future__ import annotations

import pytest
from qwen3_next_oracle import (
    LLAMA_CPP_F32,
    RUNTIME,
    context,
    greedy,
    prompt,
    transformers_answers,
)

from tessera.contract.spec import SpecParams
from tessera.engine.drafting import create_decoder
from tessera.engine.sampling import SamplerParams
from tessera.engine.slot_types import GenerationRequest, SlotSpec
from tessera.engine.slots import SlotEngine
from tessera.errors import TesseraError

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


def test_a_slot_engine_with_speculative_decoding_is_refused():
    ctx = context(LLAMA_CPP_F32, "numpy", n_seq_max=2)
    params = SpecParams()

    def create():
        return create_decoder(RUNTIME, "ngram", ctx, params)

    with pytest.raises(TesseraError, match="recurrent state"):
        SlotEngine(ctx, spec=SlotSpec("ngram", params, create))

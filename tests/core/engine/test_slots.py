"""The slot engine against the single-sequence generator (the oracle): continuous batching,
prompt-cache reuse, cancellation, the wait queue, KV pressure and slot files."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from slot_events import Collector

from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.prompt_cache import common_prefix
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.engine.slot_files import slot_file_path
from tessera.engine.slot_types import (
    EngineBusyError,
    FinishEvent,
    GenerationRequest,
    SlotBusyError,
    SlotError,
    SlotNotFoundError,
    TokenEvent,
)
from tessera.engine.slots import SlotEngine
from tessera.errors import ContextOverflowError
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

GREEDY = SamplerParams(temperature=0.0)
PROMPTS = [
    "Once upon a time",
    "The little dog ran to the",
    "In the morning, the sun",
    "She said that the",
    "A list of the",
]


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), Runtime(), "numpy")


def _engine(model, n_slots=4, n_ctx=512, **kw):
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_seq_max=n_slots, n_batch=64))
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids, **kw)
    engine.start()
    return engine


def _reference(model, prompt, n):
    ctx = Context(model, ContextParams(n_ctx=512))
    return list(generate(ctx, prompt, n, Sampler(GREEDY), eog_ids=model.tokenizer.eog_ids))


def test_concurrent_requests_get_the_tokens_of_sequential_runs(model):
    engine = _engine(model, n_slots=3)  # 5 requests on 3 slots: two wait and join later
    try:
        prompts = [model.tokenizer.encode(p) for p in PROMPTS]
        collectors = [Collector() for _ in prompts]
        for p, c in zip(prompts, collectors, strict=True):
            engine.submit(GenerationRequest(p, max_tokens=20, sampler=GREEDY), c)
        results = [c.wait() for c in collectors]
    finally:
        engine.stop()
    for p, (tokens, finish) in zip(prompts, results, strict=True):
        assert tokens == _reference(model, p, 20)
        assert finish.n_prompt == len(p) and finish.n_generated == len(tokens)
        assert finish.reason == ("length" if len(tokens) == 20 else "stop")
    # batching really happened: fewer decode calls than rows
    assert engine.metrics.n_decode_calls < engine.metrics.n_batch_rows


def test_a_shared_prefix_is_reused_and_only_new_tokens_are_evaluated(model):
    engine = _engine(model, n_slots=2)
    try:
        tok = model.tokenizer
        first = tok.encode("The little dog ran to the park and")
        c = Collector()
        engine.submit(GenerationRequest(first, max_tokens=4, sampler=GREEDY), c)
        c.wait()
        evaluated = engine.metrics.n_prompt_tokens
        second = first + tok.encode(" then it", add_special=False)
        c = Collector()
        engine.submit(GenerationRequest(second, max_tokens=8, sampler=GREEDY), c)
        tokens, finish = c.wait()
    finally:
        engine.stop()
    assert finish.n_cached == len(first)
    assert engine.metrics.n_prompt_tokens - evaluated == len(second) - len(first)
    assert tokens == _reference(model, second, 8)


def test_cache_prompt_false_evaluates_everything(model):
    engine = _engine(model, n_slots=1)
    try:
        p = model.tokenizer.encode("Once upon a time there was")
        for _ in range(2):
            c = Collector()
            engine.submit(GenerationRequest(p, max_tokens=2, sampler=GREEDY, cache_prompt=False), c)
            _, finish = c.wait()
            assert finish.n_cached == 0
    finally:
        engine.stop()
    assert engine.metrics.n_prompt_tokens == 2 * len(p)


def test_a_reused_slot_saves_its_cache_and_a_later_request_gets_it_back(model):
    engine = _engine(model, n_slots=1, prompt_store_bytes=64 << 20)
    try:
        tok = model.tokenizer
        story = tok.encode("Once upon a time there was a little dog who lived in a small house")
        other = tok.encode("In the morning, the sun came up over the green hills and")
        runs = []
        for p in (story, other, story):
            c = Collector()
            engine.submit(GenerationRequest(p, max_tokens=6, sampler=GREEDY), c)
            runs.append(c.wait())
    finally:
        engine.stop()
    assert engine.metrics.n_prompt_store_saved == 2  # each request overwrote the other
    assert engine.metrics.n_prompt_store_restored == 1
    (first, _), _, (again, finish) = runs
    assert finish.n_cached == len(story) - 1
    assert again == first == _reference(model, story, 6)


def test_cancel_frees_the_slot_at_once(model):
    engine = _engine(model, n_slots=1, max_queue=0)
    try:
        p = model.tokenizer.encode("Once upon a time")
        got_token, finished = threading.Event(), threading.Event()
        events = []

        def on_event(event):
            events.append(event)
            if isinstance(event, TokenEvent):
                got_token.set()
            if isinstance(event, FinishEvent):
                finished.set()

        task = engine.submit(GenerationRequest(p, max_tokens=-1, sampler=GREEDY), on_event)
        assert got_token.wait(60)
        # the only slot is busy and the queue holds nothing: a second request is refused
        with pytest.raises(EngineBusyError, match="slots are busy"):
            engine.submit(GenerationRequest(p, max_tokens=1), Collector())
        task.cancel()
        assert finished.wait(10)  # at the next step, not at the end of the generation
        c = Collector()
        engine.submit(GenerationRequest(p, max_tokens=3, sampler=GREEDY), c)
        tokens, finish = c.wait()
    finally:
        engine.stop()
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "cancelled"
    assert finish.reason == "length" and tokens == _reference(model, p, 3)


def test_a_prompt_that_cannot_fit_is_refused_with_both_counts(model):
    engine = _engine(model, n_slots=1, n_ctx=32)
    try:
        with pytest.raises(ContextOverflowError, match="40 tokens but the context holds 32"):
            engine.submit(GenerationRequest([1] * 40), Collector())
        with pytest.raises(SlotError, match="id_slot 5 does not exist"):
            engine.submit(GenerationRequest([1, 2], id_slot=5), Collector())
    finally:
        engine.stop()


def test_generation_stops_at_the_context_end(model):
    engine = _engine(model, n_slots=1, n_ctx=24)
    try:
        p = model.tokenizer.encode("Once upon a time")
        c = Collector()
        engine.submit(GenerationRequest(p, max_tokens=-1, sampler=GREEDY, ignore_eos=True), c)
        tokens, finish = c.wait()
    finally:
        engine.stop()
    assert finish.reason == "length"
    assert len(p) + len(tokens) == 24


def test_idle_caches_give_way_when_the_kv_cache_is_full(model):
    # two slots share 48 cells: the second request needs the cells the first one cached
    engine = _engine(model, n_slots=2, n_ctx=48)
    try:
        tok = model.tokenizer
        a = tok.encode("Once upon a time there was a little dog who")
        b = tok.encode("In the morning, the sun came up over the hills and")
        for p in (a, b):
            c = Collector()
            engine.submit(GenerationRequest(p, max_tokens=30, sampler=GREEDY, ignore_eos=True), c)
            tokens, finish = c.wait()
            assert len(tokens) == 30 and finish.reason == "length"
    finally:
        engine.stop()
    assert engine.slots[0].cache_tokens == [] or engine.slots[1].cache_tokens == []


def test_slot_save_erase_restore_continues_identically(model, tmp_path):
    engine = _engine(model, n_slots=2)
    try:
        p = model.tokenizer.encode("The little dog ran to the")
        c = Collector()
        engine.submit(GenerationRequest(p, max_tokens=10, sampler=GREEDY, id_slot=1), c)
        first, _ = c.wait()
        path = slot_file_path(tmp_path, "dog.bin")
        saved = engine.save_slot(1, path)
        assert saved["n_saved"] == len(p) + 9  # the last token was sampled, not evaluated
        assert engine.erase_slot(1)["n_erased"] == len(p) + 9
        assert engine.slots[1].cache_tokens == [] and engine.ctx.kv.seq_pos_max(1) == -1
        engine.restore_slot(1, path)
        c = Collector()
        engine.submit(GenerationRequest(p, max_tokens=10, sampler=GREEDY, id_slot=1), c)
        again, finish = c.wait()
        with pytest.raises(SlotNotFoundError):
            engine.restore_slot(1, slot_file_path(tmp_path, "missing.bin"))
        with pytest.raises(SlotNotFoundError):
            engine.erase_slot(7)
    finally:
        engine.stop()
    assert again == first
    assert finish.n_cached == len(p) - 1  # everything but the token that gives the logits


def test_a_busy_slot_cannot_be_saved(model, tmp_path):
    engine = _engine(model, n_slots=1)
    try:
        started = threading.Event()
        task = engine.submit(
            GenerationRequest([1, 5, 6], max_tokens=-1, ignore_eos=True),
            lambda e: started.set(),
        )
        assert started.wait(60)
        with pytest.raises(SlotBusyError, match="processing a request"):
            engine.save_slot(0, tmp_path / "x.bin")
        task.cancel()
    finally:
        engine.stop()
    assert not (tmp_path / "x.bin").exists()


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "..", ".hidden", "", "x" * 300, "a\\b", "nul\x00", "/etc/passwd"]
)
def test_slot_file_names_cannot_leave_the_directory(tmp_path, name):
    with pytest.raises(SlotError, match="invalid slot file name"):
        slot_file_path(tmp_path, name)


def test_slot_file_names_that_are_plain_are_kept(tmp_path):
    assert slot_file_path(tmp_path, "slot-1.v2_bin") == tmp_path / "slot-1.v2_bin"


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [1]) == 0


def _spec_engine(model, name, n_slots=3, **params):
    from tessera.contract.spec import SpecParams
    from tessera.engine.slots import SlotSpec
    from tessera.plugin_manager import Runtime

    runtime = Runtime()
    ctx = Context(model, ContextParams(n_ctx=512, n_seq_max=n_slots, n_batch=64))
    spec_params = SpecParams(**params)
    spec = SlotSpec(
        name, spec_params, lambda: runtime.spec_decoder(name).create(ctx, spec_params, runtime)
    )
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids, spec=spec)
    engine.start()
    return engine


def test_speculative_slots_give_the_tokens_of_plain_decoding(model):
    # prompts whose greedy continuations repeat, so n-gram drafts get accepted
    tok = model.tokenizer
    prompts = [tok.encode(t) for t in ("def main():", "1, 2, 3, 4,", "Once upon a time")]
    engine = _spec_engine(model, "ngram", draft_max=4)
    try:
        collectors = [Collector() for _ in prompts]
        for p, c in zip(prompts, collectors, strict=True):
            engine.submit(GenerationRequest(p, max_tokens=24, sampler=GREEDY), c)
        results = [c.wait() for c in collectors]
    finally:
        engine.stop()
    for p, (tokens, finish) in zip(prompts, results, strict=True):
        assert tokens == _reference(model, p, 24)
        assert finish.n_generated == len(tokens)
    m = engine.metrics
    assert m.n_drafted > 0 and 0 < m.n_draft_accepted <= m.n_drafted
    # accepted drafts save target steps: fewer decode calls than generated tokens
    assert m.n_decode_calls < sum(len(t) for t, _ in results)
    # rejected drafts left no cells behind: each slot holds exactly its history
    for slot in engine.slots:
        assert engine.ctx.kv.seq_pos_max(slot.id) == len(slot.cache_tokens) - 1
        cells = np.flatnonzero((engine.ctx.kv.seqs & np.uint64(1 << slot.id)) != 0)
        assert len(cells) == len(slot.cache_tokens)


def test_speculation_respects_max_tokens_and_constraints_decode_plainly(model):
    tok = model.tokenizer
    p = tok.encode("def main():")
    engine = _spec_engine(model, "ngram", n_slots=1, draft_max=8)
    try:
        for n in (1, 3, 5):
            c = Collector()
            engine.submit(GenerationRequest(p, max_tokens=n, sampler=GREEDY), c)
            tokens, finish = c.wait()
            assert tokens == _reference(model, p, n) and len(tokens) == n
        drafted = engine.metrics.n_drafted
        c = Collector()
        engine.submit(GenerationRequest(p, max_tokens=6, sampler=GREEDY, logprobs=2), c)
        tokens, _ = c.wait()
        assert tokens == _reference(model, p, 6)
        assert engine.metrics.n_drafted == drafted  # logprob requests do not speculate
    finally:
        engine.stop()

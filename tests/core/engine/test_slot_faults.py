"""A request that raises fails alone: the slot engine frees its slot and cells and goes on
serving the others; a dead or stalled engine says so through ``health()``."""

from __future__ import annotations

import time

import pytest
from slot_events import Collector

from tessera.contract.spec import SpecDecoder, SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.sampling import SamplerParams
from tessera.engine.slot_types import EngineBusyError, GenerationRequest, SlotSpec
from tessera.engine.slots import SlotEngine
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

GREEDY = SamplerParams(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), Runtime(), "numpy")


@pytest.fixture
def engine(model):
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=2, n_batch=64))
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids)
    engine.start()
    yield engine
    engine.stop()


class FailingConstraint:
    """A constraint that raises after ``n_ok`` samples (a broken grammar, say)."""

    def __init__(self, n_ok):
        self.n_ok = n_ok
        self.complete = False

    def sample(self, sampler, logits, history):
        if self.n_ok == 0:
            raise RuntimeError("constraint broke")
        self.n_ok -= 1
        return sampler.sample(logits, history)

    def accept(self, token):
        pass


def _prompt(model):
    return model.tokenizer.encode("Once upon a time")


def _healthy_after(engine, model):
    """A normal request still gets its tokens, and the engine reports healthy."""
    done = Collector()
    engine.submit(GenerationRequest(_prompt(model), max_tokens=6, sampler=GREEDY), done)
    tokens, finish = done.wait()
    assert finish.reason == "length" and len(tokens) == 6
    assert engine.health() == (True, "ok")
    assert all(s.task is None for s in engine.slots)


@pytest.mark.parametrize("n_ok", [0, 3])
def test_a_request_whose_sampling_raises_fails_alone(engine, model, n_ok):
    bad, good = Collector(), Collector()
    req = GenerationRequest(_prompt(model), max_tokens=20, sampler=GREEDY)
    engine.submit(
        GenerationRequest(req.prompt, 20, GREEDY, constraint=lambda: FailingConstraint(n_ok)),
        bad,
    )
    engine.submit(req, good)
    tokens, finish = bad.wait()
    assert finish.reason == "error" and "constraint broke" in finish.error
    assert len(tokens) == n_ok
    good_tokens, good_finish = good.wait()
    assert good_finish.reason == "length" and len(good_tokens) == 20
    slot = engine.slots[finish.id_slot]
    assert slot.cache_tokens == [] and engine.ctx.kv.seq_pos_max(slot.id) == -1  # cells freed
    _healthy_after(engine, model)


def test_a_request_that_cannot_start_fails_alone(engine, model):
    def broken_constraint():
        raise ValueError("no such grammar")

    bad = Collector()
    engine.submit(GenerationRequest(_prompt(model), 5, GREEDY, constraint=broken_constraint), bad)
    tokens, finish = bad.wait()
    assert tokens == [] and finish.reason == "error" and "no such grammar" in finish.error
    _healthy_after(engine, model)


class RaisingDrafter(SpecDecoder):
    def draft(self, history, n_max):
        raise RuntimeError("drafter broke")


def test_a_drafter_that_raises_fails_its_request_alone(model):
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=2, n_batch=64))
    spec = SlotSpec("broken", SpecParams(draft_max=4), RaisingDrafter)
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids, spec=spec)
    engine.start()
    try:
        bad = Collector()
        engine.submit(GenerationRequest(_prompt(model), 10, GREEDY), bad)
        _, finish = bad.wait()
        assert finish.reason == "error" and "drafter broke" in finish.error
        # logprob requests decode plainly, without the drafter: they still work
        plain = Collector()
        engine.submit(GenerationRequest(_prompt(model), 4, GREEDY, logprobs=1), plain)
        tokens, finish = plain.wait()
        assert finish.reason == "length" and len(tokens) == 4
        assert engine.health() == (True, "ok")
    finally:
        engine.stop()


def test_a_dead_engine_says_so_and_refuses_requests(engine, model, monkeypatch):
    def boom():
        raise SystemExit("loop bug")

    running = Collector()
    engine.submit(GenerationRequest(_prompt(model), 200, GREEDY), running)
    monkeypatch.setattr(engine, "_reap_cancelled", boom)  # the next loop turn dies
    _, finish = running.wait()
    assert finish.reason == "error" and "the engine stopped" in finish.error
    deadline = time.monotonic() + 10
    while engine.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    ok, reason = engine.health()
    assert not ok and "the engine thread stopped" in reason and "loop bug" in reason
    with pytest.raises(EngineBusyError, match="restart the server"):
        engine.submit(GenerationRequest(_prompt(model), 4, GREEDY), Collector())


def test_a_stalled_engine_says_so(model, monkeypatch):
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=1, n_batch=64))
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids, stall_after_s=0.2)
    decode = ctx.decode

    def slow(batch):
        time.sleep(1.0)
        return decode(batch)

    monkeypatch.setattr(ctx, "decode", slow)
    engine.start()
    try:
        done = Collector()
        engine.submit(GenerationRequest(_prompt(model), 2, GREEDY), done)
        deadline, seen = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            ok, reason = engine.health()
            if not ok:
                seen = reason
                break
            time.sleep(0.05)
        assert seen is not None and "no decode step for" in seen
        done.wait()
    finally:
        engine.stop()


def test_an_engine_idle_for_long_is_not_stalled_when_work_arrives(model, monkeypatch):
    ctx = Context(model, ContextParams(n_ctx=256, n_seq_max=1, n_batch=64))
    engine = SlotEngine(ctx, eog_ids=model.tokenizer.eog_ids, stall_after_s=0.5)
    decode = ctx.decode

    def slowish(batch):  # each step well inside the bound
        time.sleep(0.1)
        return decode(batch)

    monkeypatch.setattr(ctx, "decode", slowish)
    engine.start()
    try:
        time.sleep(1.0)  # idle longer than the stall bound
        done = Collector()
        engine.submit(GenerationRequest(_prompt(model), 3, GREEDY), done)
        worst = (True, "ok")
        deadline = time.monotonic() + 30
        while done.events.empty() and time.monotonic() < deadline:
            ok, reason = engine.health()
            worst = worst if ok else (ok, reason)
            time.sleep(0.005)
        done.wait()
        assert worst == (True, "ok")
    finally:
        engine.stop()

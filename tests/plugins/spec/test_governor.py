"""The speculative governor: its decisions on given timings, and a slow, always-wrong drafter
it stops in the core's loop without changing a token (greedy output equals plain decoding)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tessera.contract.spec import Draft, SpecDecoder, SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.spec.governor import SpecGovernor
from tessera.testing.models import make_gguf

GREEDY = SamplerParams(temperature=0.0)


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def model(tmp_path_factory, runtime):
    folder = tmp_path_factory.mktemp("gov")
    path = make_gguf(folder / "target.gguf", n_nextn=1, seed=11, runtime=runtime)
    return load_model(path, runtime, "numpy")


def prompts(n_vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        base = [int(t) for t in rng.integers(3, n_vocab, 3 + i % 4)]
        out.append(base * (1 + i % 3))
    return out


def plain_tokens(ctx, prompt, n):
    return list(generate(ctx, prompt, n, Sampler(GREEDY)))


def test_governor_calibrates_then_drafts_while_drafting_pays():
    gov = SpecGovernor(n_calibrate=2, replain_every=4)
    assert [gov.allow(), gov.allow()] == [False, False]  # calibration: plain steps first
    gov.record(False, 0.010, 1)
    gov.record(False, 0.010, 1)
    for _ in range(4):  # 3 tokens in 15 ms beats 10 ms per token: keep drafting
        assert gov.allow()
        gov.record(True, 0.015, 3)
    assert not gov.allow()  # every replain_every speculative steps, one plain step
    gov.record(False, 0.010, 1)
    assert gov.allow() and gov.speedup == pytest.approx(2.0)


def test_governor_backs_off_while_drafting_loses_and_resets_on_a_win():
    gov = SpecGovernor(n_calibrate=1, max_off=8, alpha=1.0, min_evidence=1)
    gov.record(False, 0.010, 1)
    offs = []
    for _ in range(4):  # each losing probe doubles the plain stretch: 2, 4, 8, 8
        assert gov.allow()
        gov.record(True, 0.030, 1)
        n = 0
        while not gov.allow():
            n += 1
        offs.append(n)
        gov.off = 0
    assert offs == [2, 4, 8, 8]
    gov.record(True, 0.004, 2)  # a winning step: drafting continues, stretch reset
    assert gov.allow() and gov.stretch == 2
    assert SpecGovernor(enabled=False).allow()  # switched off: always drafts


def test_governor_judges_speculation_by_its_tokens_per_second_not_per_step():
    """Three 1-token steps of 14 ms and one 4-token step of 14 ms: 8 ms per token, faster
    than plain 10 ms, although the average step's per-token time (11.4 ms) is slower."""
    gov = SpecGovernor(n_calibrate=1)
    gov.record(False, 0.010, 1)
    for _ in range(10):
        for n in (1, 1, 1, 4):
            gov.record(True, 0.014, n)
    assert 1.1 < gov.speedup < 1.5


class SlowWrongDrafter(SpecDecoder):
    """Costs 20 ms per draft and is always wrong: drafting can only lose."""

    def __init__(self) -> None:
        self.governor = SpecGovernor()

    def draft(self, history, n_max):
        time.sleep(0.02)
        return Draft([(history[-1] + 1) % 256] * n_max)


@pytest.mark.parametrize("adaptive", [True, False])
def test_governor_stops_a_losing_drafter_without_changing_tokens(model, adaptive):
    ctx = Context(model, ContextParams(n_ctx=96))
    prompt = prompts(model.n_vocab, 1, seed=5)[0]
    want = plain_tokens(ctx, prompt, 40)
    stats = GenerationStats()
    params = SpecParams(draft_max=4, adaptive=adaptive)
    got = list(
        generate(
            ctx, prompt, 40, Sampler(GREEDY), decoder=SlowWrongDrafter(), spec=params, stats=stats
        )
    )
    assert got == want
    if adaptive:  # 2 calibration steps, 3 to judge, then probes after 2, 4, 8, 16 ...
        assert stats.n_verify <= 8
    else:
        assert stats.n_verify >= stats.n_target_batches - 1  # the last step has no room


def test_each_decoder_of_the_plugin_carries_a_governor_of_its_own(model, runtime):
    ctx = Context(model, ContextParams(n_ctx=64))
    params = SpecParams(draft_max=4)
    first, second = (create_decoder(runtime, "mtp", ctx, params) for _ in range(2))
    assert isinstance(first.governor, SpecGovernor) and first.governor is not second.governor

"""The expert cache plugin (``--moe-cache-mib``) and expert offload (``--cpu-moe``, ``-ncmoe``).

Unit checks run the cache over a real slow tier (a random-weight ``qwen3moe`` GGUF, Q8_0)
against a plain LRU model written here: same hits, misses, evictions and order, and the
byte budget is never exceeded. Model checks compare logits of offloaded models (no cache,
budget 0, small budgets, a budget above all experts, shared cache) with the resident model:
the cache may change speed only, so logits must be identical bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.contract.experts import MoEOptions, SlowExperts, loaded_nbytes
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.moe_cache import ExpertCache
from tessera.testing.models import make_gguf

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
DIMS = {"n_layer": 3, "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 32}


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe") / "qwen3moe-q8_0.gguf"
    return make_gguf(path, "qwen3moe", qtype="q8_0", seed=4, runtime=RUNTIME, **DIMS)


def slow_tier(path, layer=0, backend="numpy"):
    gguf = read_gguf(path)
    names = [f"blk.{layer}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")]
    raws = tuple(gguf.tensors[n] for n in names)
    qtypes = tuple(RUNTIME.quant_type(r.ggml_type) for r in raws)
    return SlowExperts(raws, qtypes, RUNTIME.create_backend(backend), f"{path}:{layer}")


class ReferenceLRU:
    """The behaviour the cache must have, written as plainly as possible."""

    def __init__(self, capacity):
        self.capacity, self.order = capacity, []
        self.hits = self.misses = self.evictions = 0

    def access(self, key):
        if key in self.order:
            self.hits += 1
            self.order.remove(key)
        else:
            self.misses += 1
            if self.capacity == 0:
                return
            if len(self.order) == self.capacity:
                self.order.pop(0)
                self.evictions += 1
        self.order.append(key)


def test_lru_order_counters_and_budget_match_a_reference_lru(moe_gguf):
    slow = slow_tier(moe_gguf)
    size = slow.expert_nbytes()
    cache = ExpertCache(3 * size + size // 2)  # room for 3 experts, not 4
    ref = ReferenceLRU(3)
    rng = np.random.default_rng(0)
    for expert in rng.choice(8, size=200, p=[0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]):
        cache.fetch(slow, int(expert))
        ref.access(int(expert))
        assert cache.bytes_used <= cache.budget_bytes
        assert [e for _, e in cache.keys()] == ref.order  # least recently used first
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (
        ref.hits,
        ref.misses,
        ref.evictions,
    )
    assert stats["hits"] > 0 and stats["evictions"] > 0
    assert stats["bytes_moved"] == ref.misses * size
    assert stats["bytes_used"] == 3 * size


def test_a_hit_returns_the_weights_a_miss_converts(moe_gguf):
    slow = slow_tier(moe_gguf)
    cache = ExpertCache(10 * slow.expert_nbytes())
    first = cache.fetch(slow, 5)
    again = cache.fetch(slow, 5)
    assert again is first  # a hit does no conversion
    for got, want in zip(first, slow.load(5), strict=True):
        np.testing.assert_array_equal(got, want)
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1


def test_budget_zero_keeps_nothing_and_every_use_converts(moe_gguf):
    slow = slow_tier(moe_gguf)
    cache = ExpertCache(0)
    for expert in (1, 1, 2, 1):
        cache.fetch(slow, expert)
    assert cache.stats() | {"hit_rate": 0.0} == {
        "hits": 0,
        "misses": 4,
        "evictions": 0,
        "bytes_moved": 4 * slow.expert_nbytes(),
        "bytes_used": 0,
        "budget_bytes": 0,
        "entries": 0,
        "hit_rate": 0.0,
    }
    assert slow.loads == 5  # 4 misses + expert_nbytes()


def test_budget_above_all_experts_misses_each_expert_once(moe_gguf):
    slow = slow_tier(moe_gguf)
    cache = ExpertCache(100 * slow.expert_nbytes())
    for _ in range(3):
        for expert in range(8):
            cache.fetch(slow, expert)
    stats = cache.stats()
    assert (stats["misses"], stats["hits"], stats["evictions"]) == (8, 16, 0)
    assert stats["entries"] == 8


def test_shared_cache_keys_keep_layers_apart(moe_gguf):
    a, b = slow_tier(moe_gguf, 0), slow_tier(moe_gguf, 1)
    cache = ExpertCache(100 * a.expert_nbytes())
    wa, wb = cache.fetch(a, 3), cache.fetch(b, 3)
    assert cache.stats()["misses"] == 2
    assert not np.array_equal(wa[0], wb[0])


def test_negative_budget_is_refused():
    with pytest.raises(ValueError, match=">= 0"):
        ExpertCache(-1)


def logits_of(model, prompt, n_ubatch=512):
    ctx = Context(model, ContextParams(n_ctx=64, n_ubatch=n_ubatch))
    first = ctx.decode(Batch.for_sequence(prompt, logits="all"))
    steps = [
        ctx.decode(Batch.for_sequence([t], start_pos=len(prompt) + i))
        for i, t in enumerate(prompt[:4])
    ]
    return np.concatenate([first, *steps])


def load(path, backend, **moe):
    b = RUNTIME.create_backend(backend, dtype="f32")
    return load_model(path, RUNTIME, b, moe=MoEOptions(**moe))


PLACEMENTS = {
    "cpu-moe-no-cache": {"cpu_moe": True},
    "cpu-moe-budget-0": {"cpu_moe": True, "cache_mib": 0},
    "cpu-moe-tiny-budget": {"cpu_moe": True, "cache_mib": 0.05},  # 2 of 24 experts (24 KiB each)
    "cpu-moe-half": {"cpu_moe": True, "cache_mib": 0.3},
    "cpu-moe-all-fit": {"cpu_moe": True, "cache_mib": 64},
    "ncmoe-1": {"n_cpu_moe": 1, "cache_mib": 0.05},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_offloaded_and_cached_experts_give_identical_logits(moe_gguf, backend, placement):
    prompt = np.random.default_rng(1).integers(0, 4096, 9)
    want = logits_of(load(moe_gguf, backend), prompt)
    model = load(moe_gguf, backend, **PLACEMENTS[placement])
    np.testing.assert_array_equal(logits_of(model, prompt), want)
    offloaded = model.experts.slow_layers()
    assert len(offloaded) == (1 if placement == "ncmoe-1" else DIMS["n_layer"])
    cache = model.experts.cache
    if PLACEMENTS[placement].get("cache_mib", 0) == 0:
        assert cache is None
        return
    stats = cache.stats()
    assert stats["bytes_used"] <= stats["budget_bytes"]
    assert stats["misses"] == sum(s.loads for s in offloaded)
    if placement == "cpu-moe-all-fit":
        assert stats["evictions"] == 0 and stats["misses"] <= 8 * DIMS["n_layer"]
    if placement == "cpu-moe-tiny-budget":
        assert stats["evictions"] > 0


def test_resident_layers_convert_each_expert_once_at_load(moe_gguf):
    model = load(moe_gguf, "numpy", n_cpu_moe=1)
    assert model.experts.cache is None
    resident = [model.experts.layer(il) for il in (1, 2)]
    one = sum(loaded_nbytes(w) for w in resident[0].get([0])[0])
    assert one == 3 * 32 * 64 * 4  # gate, up, down of one expert in f32


def test_shared_cache_serves_two_models_with_one_budget(moe_gguf, tmp_path):
    other = make_gguf(tmp_path / "other.gguf", "qwen3moe", qtype="q8_0", seed=9, **DIMS)
    runtime = Runtime()
    opts = MoEOptions(cpu_moe=True, cache_mib=0.2, shared=True)
    m1 = load_model(moe_gguf, runtime, "numpy", moe=opts)
    m2 = load_model(other, runtime, "numpy", moe=opts)
    assert m1.experts.cache is m2.experts.cache
    prompt = np.random.default_rng(2).integers(0, 4096, 6)
    np.testing.assert_array_equal(logits_of(m1, prompt), logits_of(load(moe_gguf, "numpy"), prompt))
    np.testing.assert_array_equal(logits_of(m2, prompt), logits_of(load(other, "numpy"), prompt))
    sources = {key.split(":")[0] for key, _ in m1.experts.cache.keys()}
    assert sources <= {str(moe_gguf), str(other)}
    assert m1.experts.cache.stats()["bytes_used"] <= opts.cache_bytes


def test_without_the_cache_plugin_offloaded_experts_still_run(moe_gguf):
    runtime = Runtime(disabled=["moe-cache"])
    model = load_model(moe_gguf, runtime, "numpy", moe=MoEOptions(cpu_moe=True, cache_mib=1))
    assert model.experts.cache is None
    prompt = np.arange(5)
    np.testing.assert_array_equal(
        logits_of(model, prompt), logits_of(load(moe_gguf, "numpy"), prompt)
    )


def run_cli(capsys, *argv):
    from tessera.cli.main import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_flags_offload_and_cache_without_changing_the_text(capsys, moe_gguf):
    args = ["run", "-m", str(moe_gguf), "-p", "The for statement", "-n", "6", "--temp", "0"]
    code, resident, err = run_cli(capsys, *args, "--backend", "numpy")
    assert code == 0, err
    for flags in (["--cpu-moe", "--moe-cache-mib", "0.1"], ["-ncmoe", "2", "--moe-cache-shared"]):
        code, out, err = run_cli(capsys, *args, "--backend", "numpy", *flags)
        assert code == 0, err
        assert out == resident


def test_cli_refuses_a_negative_budget_in_one_line(capsys, moe_gguf):
    code, _, err = run_cli(capsys, "run", "-m", str(moe_gguf), "-p", "x", "--moe-cache-mib", "-1")
    assert code != 0
    assert err.strip().splitlines()[-1].startswith("error: --moe-cache-mib")

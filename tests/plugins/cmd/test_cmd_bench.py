"""``tessera bench``: llama-bench's tests, statistics, field names and output formats."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
from pathlib import Path

import pytest

from tessera.contract.experts import MoEOptions
from tessera.errors import TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd import bench
from tessera.testing import shapes
from tessera.testing.commands import registered_command
from tessera.testing.models import make_gguf
from tessera.testing.terminal import stderr_on_a_terminal

RUNTIME = Runtime()


@pytest.fixture(scope="module")
def gemma4_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("bench") / "g4.gguf", "gemma4", n_layer=6, seed=1)


def _run(capsys, *argv: str) -> str:
    command = registered_command("tessera.plugins.cmd.bench", "bench")
    parser = argparse.ArgumentParser(prog="tessera bench")
    command.add_arguments(parser)
    args = parser.parse_args(["--backend", "numpy", *argv])
    assert command.run(args, RUNTIME) == 0
    return capsys.readouterr().out


def test_is_registered_through_its_entry_point():
    assert "bench" in RUNTIME.commands()


def test_pp_and_tg_with_pruning_on_and_off_in_one_run(gemma4_gguf, capsys):
    out = _run(capsys, "-m", str(gemma4_gguf), "-p", "12", "-n", "3", "-r", "3",
               "--prune", "on,off", "-o", "json")  # fmt: skip
    records = json.loads(out)
    assert [(r["prune"], r["test"]) for r in records] == [
        ("on", "pp12"), ("off", "pp12"), ("on", "tg3"), ("off", "tg3"),
    ]  # fmt: skip
    for r in records:
        assert len(r["samples_ns"]) == len(r["samples_ts"]) == 3
        n_tokens = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([n_tokens / (ns / 1e9) for ns in r["samples_ns"]])
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]))
        assert r["avg_ns"] == pytest.approx(statistics.fmean(r["samples_ns"]), abs=1)
        assert r["model_n_params"] > 0 and r["backends"] == "numpy"
    # only a prompt with pruning allowed is pruned; one-token decodes never are
    assert [r["pruned"] for r in records] == [True, False, False, False]
    assert records[1]["prune_reason"] == "--no-prune"


def test_zero_skips_a_test_kind(gemma4_gguf, capsys):
    only_tg = json.loads(_run(capsys, "-m", str(gemma4_gguf), "-p", "0", "-n", "2", "-r", "1",
                              "-o", "json"))  # fmt: skip
    assert [r["test"] for r in only_tg] == ["tg2"]
    only_pp = json.loads(_run(capsys, "-m", str(gemma4_gguf), "-p", "4,8", "-n", "0", "-r", "1",
                              "-o", "json", "--no-prune"))  # fmt: skip
    assert [(r["test"], r["prune"]) for r in only_pp] == [("pp4", "off"), ("pp8", "off")]


def test_md_jsonl_and_csv_outputs(gemma4_gguf, capsys):
    base = ["-m", str(gemma4_gguf), "-p", "6", "-n", "2", "-r", "2", "-ub", "4,512"]
    md = _run(capsys, *base).splitlines()
    assert md[0].startswith("| model ") and "| t/s |" in md[0]
    assert len(md) == 2 + 4 and all(" ± " in line for line in md[2:])
    assert [line.split("|")[6].strip() for line in md[2:]] == ["4", "512", "4", "512"]
    lines = _run(capsys, *base, "-o", "jsonl").splitlines()
    assert [json.loads(line)["n_ubatch"] for line in lines] == [4, 512, 4, 512]
    rows = list(csv.DictReader(io.StringIO(_run(capsys, *base, "-o", "csv"))))
    assert [r["test"] for r in rows] == ["pp6", "pp6", "tg2", "tg2"]
    assert {"avg_ts", "stddev_ts", "n_prompt", "n_gen", "samples_ns"} <= set(rows[0])


def test_each_tests_rows_are_printed_as_soon_as_it_is_measured(gemma4_gguf, capsys, monkeypatch):
    timed = []  # the tests run so far, in order
    printed = []  # (test, instance's n_ubatch, how many runs were done when it was printed)
    real_run_test = bench.run_test

    def counting_run_test(ctx, test, rng):
        timed.append(test.name)
        return real_run_test(ctx, test, rng)

    class SpyPrinter(bench.Printer):
        def row(self, record):
            printed.append((record["test"], record["n_ubatch"], len(timed)))
            super().row(record)

    monkeypatch.setattr(bench, "run_test", counting_run_test)
    monkeypatch.setattr(bench, "Printer", SpyPrinter)
    out = _run(capsys, "-m", str(gemma4_gguf), "-p", "6", "-n", "2", "-r", "3", "-ub", "4,512",
               "--no-warmup")  # fmt: skip
    # pp6's two rows come after its 2 x 3 runs, before any tg2 run; tg2's at the end
    assert printed == [("pp6", 4, 6), ("pp6", 512, 6), ("tg2", 4, 12), ("tg2", 512, 12)]
    assert timed == ["pp6"] * 6 + ["tg2"] * 6
    assert len(out.splitlines()) == 2 + 4


def test_shape_models_are_built_in_memory(capsys, monkeypatch):
    tiny = ("gemma4", {"n_layer": 6, "n_embd": 32, "n_ff": 64, "n_kv_shared": 3})
    monkeypatch.setitem(shapes.SHAPES, "tiny-gemma4", tiny)
    records = json.loads(_run(capsys, "--shape", "tiny-gemma4", "--shape-vocab", "300",
                              "-p", "9", "-n", "0", "-r", "1", "-o", "json"))  # fmt: skip
    assert records[0]["model_type"] == "gemma4 random tiny-gemma4"
    assert records[0]["pruned"] is True


def test_building_a_shape_model_draws_a_bar_on_a_terminal_only(capsys, monkeypatch):
    tiny = ("llama", {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_head_kv": 1, "n_ff": 64})
    monkeypatch.setitem(shapes.SHAPES, "tiny-llama", tiny)
    arch, config = shapes.shape_config(RUNTIME, "tiny-llama", 300)
    argv = ["--shape", "tiny-llama", "--shape-vocab", "300", "-p", "4", "-n", "0", "-r", "1"]
    with stderr_on_a_terminal() as term:
        out = _run(capsys, *argv, "-o", "jsonl")
    n_tensors = len(arch.tensor_shapes(config))
    assert "building random tiny-llama" in term.text and f"/{n_tensors}" in term.text
    assert json.loads(out)["test"] == "pp4"  # the table still goes to stdout
    command = registered_command("tessera.plugins.cmd.bench", "bench")
    parser = argparse.ArgumentParser(prog="tessera bench")
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--backend", "numpy", *argv]), RUNTIME) == 0
    assert capsys.readouterr().err == ""


def test_named_shapes_have_the_real_layer_counts():
    e2b = shapes.shape_config(RUNTIME, "gemma4-e2b")[1]
    assert (e2b.n_layer, e2b.n_embd, e2b.n_kv_shared, e2b.first_shared) == (35, 1536, 20, 15)
    assert sum(not s for s in e2b.swa_layers) == 7 and e2b.n_ff[0] * 2 == e2b.n_ff[-1] == 12288
    e4b = shapes.shape_config(RUNTIME, "gemma4-e4b")[1]
    assert (e4b.n_layer, e4b.n_embd, e4b.n_kv_shared, e4b.first_shared) == (42, 2560, 18, 24)
    assert sum(not s for s in e4b.swa_layers) == 7 and set(e4b.n_ff) == {10240}
    qwen = shapes.shape_config(RUNTIME, "qwen2-0.5b", n_vocab=1000)[1]
    assert (qwen.n_layer, qwen.n_embd, qwen.n_vocab) == (24, 896, 1000)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "no-such"], "unknown shape 'no-such'"),
        (["--prune", "auto"], "--prune takes on or off"),
        (["-r", "0"], "-r must be at least 1"),
        (["--shape", "qwen2-0.5b", "--cpu-moe"], "need -m with an MoE model"),
        (["--moe-cache-mib", "-1"], "take a number >= 0"),
    ],
)
def test_bad_input_is_one_clear_error(gemma4_gguf, capsys, argv, message):
    command = registered_command("tessera.plugins.cmd.bench", "bench")
    parser = argparse.ArgumentParser(prog="tessera bench")
    command.add_arguments(parser)
    if "--shape" not in argv:
        argv = ["-m", str(gemma4_gguf), *argv]
    args = parser.parse_args(["--backend", "numpy", "-p", "4", "-n", "1", *argv])
    with pytest.raises(TesseraError, match=message):
        command.run(args, RUNTIME)


MOE = Path(__file__).resolve().parents[3] / "core" / "default_model" / "tessera-moe.gguf"


@pytest.mark.parametrize("evicts", [True, False])
def test_moe_offload_flags_and_cache_counters(capsys, evicts):
    model = load_model(MOE, RUNTIME, "numpy", moe=MoEOptions(cpu_moe=True))
    slow = model.experts.slow_layers()
    # budgets from the file: room for two (numpy, float32) experts while a step needs
    # layers x top-k of them, so the cache thrashes; or room for every expert
    expert_mib = slow[0].expert_nbytes() / 2**20
    thrash_mib = math.ceil(2.5 * expert_mib)
    cache_mib = thrash_mib if evicts else math.ceil(sum(s.n_expert for s in slow) * expert_mib) + 1
    assert thrash_mib < 3 * expert_mib < len(slow) * model.config.n_expert_used * expert_mib
    argv = ["-m", str(MOE), "-p", "0", "-n", "4", "-r", "3", "--cpu-moe"]
    off = json.loads(_run(capsys, *argv, "-o", "json"))
    assert not any(k.startswith("moe_cache") for k in off[0])  # offloaded, no cache
    (r,) = json.loads(_run(capsys, *argv, "--moe-cache-mib", str(cache_mib), "-o", "json"))
    # every decode step asks each MoE layer for its top-k experts, once each
    lookups = 4 * 3 * len(slow) * model.config.n_expert_used
    assert r["moe_cache_hits"] + r["moe_cache_misses"] == lookups
    assert r["moe_cache_hit_rate"] == pytest.approx(r["moe_cache_hits"] / lookups)
    assert r["moe_cache_bytes_moved"] == r["moe_cache_misses"] * slow[0].expert_nbytes()
    assert r["moe_cache_budget_bytes"] == cache_mib * 2**20
    if evicts:
        assert 0 < r["moe_cache_evictions"] <= r["moe_cache_misses"]
    else:  # everything fits: the warm-up's experts stay, no evictions
        assert r["moe_cache_evictions"] == 0 and r["moe_cache_hits"] > r["moe_cache_misses"]
    md = _run(capsys, *argv, "-r", "1", "--moe-cache-mib", str(cache_mib)).splitlines()
    assert md[0].endswith("| moe hits |") and md[2].endswith(f" of {lookups // 3} |")
    rows = list(csv.DictReader(io.StringIO(_run(capsys, *argv, "--moe-cache-mib",
                                                str(thrash_mib), "-o", "csv"))))  # fmt: skip
    assert int(rows[0]["moe_cache_hits"]) + int(rows[0]["moe_cache_misses"]) == lookups


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-b", "512,0"], "-b/--batch-size: expected values >= 1, got '512,0'"),
        (["-ub", "0"], "-ub/--ubatch-size: expected values >= 1"),
        (["-t", "-1"], "-t/--threads: expected values >= 0"),
    ],
)
def test_list_flags_out_of_range_are_refused_when_parsed(capsys, argv, message):
    command = registered_command("tessera.plugins.cmd.bench", "bench")
    parser = argparse.ArgumentParser(prog="tessera bench")
    command.add_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_depth_and_cache_types_as_llama_bench(gemma4_gguf, capsys):
    """-d runs each test after that many tokens in the cache (named as llama-bench names
    them, n_depth in the record); -ctk/-ctv are list flags of the instance."""
    out = _run(capsys, "-m", str(gemma4_gguf), "-p", "4", "-n", "2", "-d", "0,8", "-r", "1",
               "-ctk", "f32,f16", "-o", "json")  # fmt: skip
    records = json.loads(out)
    assert [(r["test"], r["n_depth"], r["type_k"], r["type_v"]) for r in records] == [
        ("pp4", 0, "f32", "f32"), ("pp4", 0, "f16", "f32"),
        ("pp4 @ d8", 8, "f32", "f32"), ("pp4 @ d8", 8, "f16", "f32"),
        ("tg2", 0, "f32", "f32"), ("tg2", 0, "f16", "f32"),
        ("tg2 @ d8", 8, "f32", "f32"), ("tg2 @ d8", 8, "f16", "f32"),
    ]  # fmt: skip


def test_the_depth_is_decoded_before_the_timed_part(monkeypatch):
    """The depth's tokens go in first (positions 0 .. d-1, in -b chunks), then the test's."""
    import numpy as np

    seen = []  # (positions of a batch, whether the clock had started)
    started = []

    class Ctx:
        params = argparse.Namespace(n_batch=4)
        model = argparse.Namespace(n_vocab=10, graph=None, experts=None)
        kv = argparse.Namespace(clear=lambda: None)

        def decode(self, batch):
            seen.append((batch.positions.tolist(), bool(started)))

    clock = iter(range(10))
    monkeypatch.setattr(bench.time, "perf_counter_ns", lambda: started.append(1) or next(clock))
    inst = bench.Instance(4, 4, 0, "auto", "on")
    bench.run_test(Ctx(), bench.Test(inst, 3, 2, n_depth=6), np.random.default_rng(0))
    assert seen == [
        ([0, 1, 2, 3], False), ([4, 5], False), ([6, 7, 8], True), ([9], True), ([10], True),
    ]  # fmt: skip

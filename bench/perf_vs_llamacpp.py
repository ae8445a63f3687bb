"""tessera vs llama.cpp vs HF transformers on the same GGUF files, interleaved in one run.

    .venv/bin/python bench/perf_vs_llamacpp.py [--models qwen2-0.5b,default]
        [--types F16,Q8_0,Q4_0,Q4_K] [-p 512] [-n 128] [-r 3] [-t 2]
        [--llama-bench PATH] [--no-hf] [--work /tmp/tessera-perf] [-o results.json]

Engines: tessera (torch backend, its automatic dtype and kernels), llama.cpp (a
``llama-bench`` binary given by ``--llama-bench``, or llama-cpp-python when importable;
neither is a dependency) and HF transformers (f32 and bf16; once per model, since it
runs no GGUF types). Each repetition runs every engine once, one after the other, so a
burst of load on a shared machine hits all of them alike; ratios are medians of the
per-repetition ratios. Tests as llama-bench: ``pp<n>`` = n prompt tokens into an empty
cache in one batch, ``tg<n>`` = n tokens one at a time into an empty cache.

The same run measures the machine's limits (bench/perf_limits.py) and prints each result
as a fraction of its ceiling; the read bandwidth is measured again at the start of every
repetition round, and each decode result is set against its own round's bandwidth.
Without llama.cpp the table shows the numbers quoted in issue 12 (measured earlier on
this machine), labelled as quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import perf_limits
import perf_models

#: llama.cpp on a random Qwen2.5-0.5B-shaped model, 2 threads, this machine (issue 12).
QUOTED_LLAMA_CPP = {
    ("qwen2-0.5b", "F16"): (168.0, 13.8),
    ("qwen2-0.5b", "Q8_0"): (160.0, 20.6),
    ("qwen2-0.5b", "Q4_0"): (172.0, 32.1),
}


class TesseraEngine:
    """tessera's torch backend; ``env`` (switches, read when weights load) makes a variant."""

    def __init__(
        self, path: Path, runtime: Any, threads: int, n_ctx: int, label: str = "", env=None
    ) -> None:
        from tessera.engine.context import Context, ContextParams
        from tessera.files.load import load_model

        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.model = load_model(path, runtime, "torch")
        finally:
            for k, v in saved.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        self.model.backend.set_threads(threads)
        self.ctx = Context(self.model, ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512))
        self.name = f"tessera {self.model.backend.dtype}" + (f" {label}" if label else "")
        self.rng = np.random.default_rng(0)

    def run(self, n_prompt: int, n_gen: int) -> float:
        from tessera.plugins.cmd.bench import Instance, Test, run_test

        test = Test(Instance(512, 512, 0, "auto", "on"), n_prompt, n_gen)
        return run_test(self.ctx, test, self.rng) / 1e9


class HFEngine:
    def __init__(self, tessera_model: Any, dtype: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        config = perf_models.hf_config(tessera_model)
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
        self.n_vocab = config.vocab_size
        self.name = f"HF {dtype}"

    def run(self, n_prompt: int, n_gen: int) -> float:
        import torch
        from transformers import DynamicCache

        ids = torch.randint(0, self.n_vocab, (1, max(n_prompt, n_gen)))
        cache = DynamicCache()
        start = time.perf_counter()
        with torch.inference_mode():
            if n_prompt:
                self.model(ids[:, :n_prompt], past_key_values=cache, logits_to_keep=1)
            for i in range(n_gen):
                self.model(ids[:, i : i + 1], past_key_values=cache, logits_to_keep=1)
        return time.perf_counter() - start


class LlamaBenchEngine:
    """One ``llama-bench -r 1`` process per test (it reports the test's own time)."""

    def __init__(self, binary: str, path: Path, threads: int) -> None:
        self.binary, self.path, self.threads = binary, path, threads
        self.name = "llama.cpp"

    def run(self, n_prompt: int, n_gen: int) -> float:
        cmd = [self.binary, "-m", str(self.path), "-p", str(n_prompt), "-n", str(n_gen)]
        cmd += ["-t", str(self.threads), "-r", "1", "-o", "json", "--no-warmup"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        return sum(record["avg_ns"] for record in json.loads(out)) / 1e9  # a pp and/or a tg


class LlamaCppPythonEngine:
    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.name = "llama.cpp (python)"

    def run(self, n_prompt: int, n_gen: int) -> float:
        tokens = np.random.default_rng(0).integers(0, self.n_vocab, max(n_prompt, n_gen))
        self.llm.reset()
        start = time.perf_counter()
        if n_prompt:
            self.llm.eval(tokens[:n_prompt].tolist())
        for t in tokens[:n_gen].tolist():
            self.llm.eval([t])
        return time.perf_counter() - start


def variants(specs: list[str]) -> list[tuple[str, dict[str, str]]]:
    """``LABEL:VAR=VALUE,VAR=VALUE`` specs as ``(label, env)``."""
    out = []
    for spec in specs:
        label, _, assignments = spec.partition(":")
        pairs = [a.partition("=") for a in assignments.split(",") if a]
        if not label or not pairs or any(not eq for _, eq, _ in pairs):
            raise SystemExit(f"--tessera-env wants LABEL:VAR=VALUE[,VAR=VALUE], got '{spec}'")
        out.append((label, {k: v for k, _, v in pairs}))
    return out


def llama_engine(args: argparse.Namespace, path: Path) -> Any:
    if args.llama_bench:
        return LlamaBenchEngine(args.llama_bench, path, args.threads)
    try:
        return LlamaCppPythonEngine(path, args.threads, args.n_prompt + args.n_gen + 16)
    except ImportError:
        return None


#: The results key of the read bandwidth measured before each repetition round (bytes/s).
BANDWIDTH = ("machine", "bandwidth")


def interleave(
    engines: list[Any], tests: list[tuple[int, int]], reps: int, results: dict, threads: int
) -> None:
    """Warm-up, then rep by rep: the read bandwidth, then every engine runs every test;
    samples in tokens/s (bandwidth in bytes/s under :data:`BANDWIDTH`)."""
    for engine in engines:
        engine.run(8, 1)
    for rep in range(reps):
        results.setdefault(BANDWIDTH, []).append(perf_limits.read_bandwidth(threads))
        print(f"  rep {rep + 1} read bandwidth {results[BANDWIDTH][-1] / 1e9:.1f} GB/s", flush=True)
        for engine in engines:
            for n_prompt, n_gen in tests:
                seconds = engine.run(n_prompt, n_gen)
                key = (engine.name, "pp" if n_prompt else "tg")
                results.setdefault(key, []).append((n_prompt + n_gen) / seconds)
                print(f"  rep {rep + 1} {engine.name:20} {key[1]}: {results[key][-1]:8.1f} t/s",
                      flush=True)  # fmt: skip


def _fmt(samples: list[float] | None) -> str:
    if not samples:
        return "-"
    sd = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return f"{statistics.fmean(samples):.1f} ± {sd:.1f}"


def _ratio(a: list[float] | None, b: list[float] | None) -> str:
    if not a or not b:
        return "-"
    return f"{statistics.median(x / y for x, y in zip(a, b, strict=False)):.2f}x"


def report(rows: list[dict], limits: perf_limits.Limits, args: argparse.Namespace) -> None:
    gib = 2**30
    print(f"\nmachine limits ({args.threads} threads, best of 5): read bandwidth "
          f"{limits.bandwidth / 1e9:.1f} GB/s, matmul peak f32 {limits.peak_f32 / 1e9:.0f} "
          f"GFLOP/s, bf16 {limits.peak_bf16 / 1e9:.0f} GFLOP/s")  # fmt: skip
    pp, tg = f"pp{args.n_prompt}", f"tg{args.n_gen}"
    print(f"\n| model | type | engine | {pp} t/s | {tg} t/s | {pp} vs llama.cpp | "
          f"{tg} vs llama.cpp | {tg} vs HF best | {pp} / ceiling | {tg} / ceiling |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ceil_pp, ceil_tg = row["ceilings"]
        res = row["results"]
        llama = row["llama"]
        hf = row["hf"]  # HF ran in the model's first block only (it runs no GGUF types)
        hf_best = max(
            (k for k in hf if k[1] == "tg"), key=lambda k: statistics.fmean(hf[k]), default=None
        )
        for name in dict.fromkeys(k[0] for k in res if k != BANDWIDTH):
            p, t = res.get((name, "pp")), res.get((name, "tg"))
            vs_pp = _ratio(p, res.get((llama, "pp"))) if llama and name != llama else "-"
            vs_tg = _ratio(t, res.get((llama, "tg"))) if llama and name != llama else "-"
            vs_hf = "-"
            if name.startswith("tessera") and hf_best and t:
                vs_hf = f"{statistics.median(t) / statistics.median(hf[hf_best]):.2f}x"
            if not llama and row["quoted"] and name.startswith("tessera"):
                qp, qt = row["quoted"]
                vs_pp = f"{statistics.median(p) / qp:.2f}x (quoted)" if p else "-"
                vs_tg = f"{statistics.median(t) / qt:.2f}x (quoted)" if t else "-"
            frac_pp = f"{statistics.median(p) / ceil_pp:.0%}" if p else "-"
            frac_tg = "-"
            if t:  # each round's result against the bandwidth measured in that round
                fracs = [x * row["bytes"] / b for x, b in zip(t, res[BANDWIDTH], strict=True)]
                frac_tg = f"{statistics.median(fracs):.0%}"
            print(f"| {row['model']} | {row['type']} | {name} | {_fmt(p)} | {_fmt(t)} | {vs_pp} "
                  f"| {vs_tg} | {vs_hf} | {frac_pp} | {frac_tg} |")  # fmt: skip
        if not llama and row["quoted"]:
            qp, qt = row["quoted"]
            print(f"| {row['model']} | {row['type']} | llama.cpp (quoted in issue 12, not "
                  f"this run) | {qp} | {qt} | - | - | - | {qp / ceil_pp:.0%} | "
                  f"{qt / ceil_tg:.0%} |")  # fmt: skip
    print("\nread bandwidth per round (GB/s; the tg / ceiling column uses these): " + "; ".join(
        f"{r['model']} {r['type']}: " + ", ".join(f"{b / 1e9:.1f}" for b in r["results"][BANDWIDTH])
        for r in rows))  # fmt: skip
    print("\nceilings (up-front bandwidth): " + "; ".join(
        f"{r['model']} {r['type']}: pp {r['ceilings'][0]:.0f} t/s, tg {r['ceilings'][1]:.1f} t/s "
        f"({r['bytes'] / gib:.2f} GiB read per token)" for r in rows))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="qwen2-0.5b,default", help="shapes and/or default")
    parser.add_argument("--types", default="F16,Q8_0,Q4_0,Q4_K", help="GGUF types to compare")
    parser.add_argument("--vocab", type=int, default=None, help="vocab of shape models (real)")
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-bench", default=None, help="path of a llama-bench binary")
    parser.add_argument("--no-hf", action="store_true", help="skip HF transformers")
    parser.add_argument("--work", default="/tmp/tessera-perf", help="folder for model files")
    parser.add_argument("-o", "--output", default=None, help="also write results as JSON here")
    parser.add_argument(
        "--tessera-env",
        action="append",
        default=[],
        help="an extra tessera variant, LABEL:VAR=VALUE[,VAR=VALUE] (e.g. a switch turned off)",
    )
    args = parser.parse_args()

    import torch

    from tessera.plugin_manager import Runtime

    runtime = Runtime()
    limits = perf_limits.measure(args.threads)
    tests = [(args.n_prompt, 0), (0, args.n_gen)]
    n_ctx = args.n_prompt + args.n_gen + 16
    rows = []
    for model in args.models.split(","):
        hf_results: dict = {}
        for i, qtype in enumerate(args.types.split(",")):
            path = perf_models.model_file(Path(args.work), runtime, model, qtype, args.vocab)
            print(f"\n{model} {qtype}: {path}", flush=True)
            engines = [TesseraEngine(path, runtime, args.threads, n_ctx)]
            for label, env in variants(args.tessera_env):
                engines.append(TesseraEngine(path, runtime, args.threads, n_ctx, label, env))
            llama = llama_engine(args, path)
            engines += [llama] if llama else []
            if i == 0 and not args.no_hf:  # HF runs no GGUF types: once per model
                engines += [HFEngine(engines[0].model, d, args.threads) for d in ("f32", "bf16")]
            results: dict = {}
            interleave(engines, tests, args.repetitions, results, args.threads)
            if i == 0:
                hf_results = {k: v for k, v in results.items() if k[0].startswith("HF")}
            cost = perf_limits.model_cost(path)
            rows.append({
                "model": model, "type": qtype, "results": results,
                "llama": llama.name if llama else None, "hf": hf_results,
                "quoted": QUOTED_LLAMA_CPP.get((model, qtype)) if not args.vocab else None,
                "ceilings": perf_limits.ceilings(limits, cost), "bytes": cost.decode_bytes,
            })  # fmt: skip
            del engines, llama
    print(f"\n{sys.argv[0]} {' '.join(sys.argv[1:])}")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {args.threads} threads, "
          f"{args.repetitions} interleaved repetitions")  # fmt: skip
    report(rows, limits, args)
    if args.output:

        def keyed(d: dict) -> dict:
            return {f"{k[0]} {k[1]}": v for k, v in d.items()}

        data = [{**r, "results": keyed(r["results"]), "hf": keyed(r["hf"])} for r in rows]
        tmp = Path(args.output + ".tmp")
        tmp.write_text(json.dumps({"limits": attrs.asdict(limits), "rows": data}, indent=1))
        tmp.replace(args.output)


if __name__ == "__main__":
    main()

"""tessera vs llama.cpp vs HF transformers on the same GGUF files, interleaved in one run.

    .venv/bin/python bench/perf_vs_llamacpp.py [--models qwen2-0.5b,default]
        [--types F16,Q8_0,Q4_0,Q4_K] [-p 512] [-n 128] [-d 0,4096,16384] [-r 3] [-t 2]
        [-ctk q8_0] [-ctv q8_0] [--llama-bench PATH] [--no-hf] [--work /tmp/tessera-perf]
        [-o results.json]

Engines: tessera (torch backend, its automatic dtype and kernels), llama.cpp (a
``llama-bench`` binary given by ``--llama-bench``, or llama-cpp-python when importable;
neither is a dependency) and HF transformers (f32 and bf16; once per model, since it
runs no GGUF types). Each repetition runs every engine once, one after the other, so a
burst of load on a shared machine hits all of them alike; ratios are medians of the
per-repetition ratios. Tests as llama-bench: ``pp<n>`` = n prompt tokens into an empty
cache in one batch, ``tg<n>`` = n tokens one at a time into an empty cache; with ``-d``,
each also after that many tokens decoded into the cache untimed (a row per depth).
``-ctk`` / ``-ctv`` give both runtimes the cache types (default: tessera's compute dtype,
llama.cpp's f16). ``--tessera-exe old:/tmp/old-venv/bin/tessera`` adds another tessera
install (an older tree, for a before/after run) as an engine, interleaved like the others.
The engines are in bench/perf_engines.py.

The same run measures the machine's limits (bench/perf_limits.py) and prints each result
as a fraction of its ceiling; the read bandwidth is measured again at the start of every
repetition round, and each decode result is set against its own round's bandwidth.
Without llama.cpp the table shows the numbers measured earlier on the development VM,
labelled as quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import attrs
import perf_limits
import perf_models
from perf_engines import HFEngine, TesseraBenchEngine, TesseraEngine, llama_engine

#: llama.cpp on a random Qwen2.5-0.5B-shaped model, 2 threads, the development VM.
QUOTED_LLAMA_CPP = {
    ("qwen2-0.5b", "F16"): (168.0, 13.8),
    ("qwen2-0.5b", "Q8_0"): (160.0, 20.6),
    ("qwen2-0.5b", "Q4_0"): (172.0, 32.1),
}


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


#: The results key of the read bandwidth measured before each repetition round (bytes/s).
BANDWIDTH = ("machine", "bandwidth")


def interleave(
    engines: list[Any],
    tests: list[tuple[int, int]],
    reps: int,
    results: dict,
    threads: int,
    depth: int = 0,
) -> None:
    """Warm-up, then rep by rep: the read bandwidth, then every engine runs every test
    (after ``depth`` tokens in the cache); samples in tokens/s (bandwidth in bytes/s under
    :data:`BANDWIDTH`)."""
    for engine in engines:
        engine.run(8, 1)
    for rep in range(reps):
        results.setdefault(BANDWIDTH, []).append(perf_limits.read_bandwidth(threads))
        print(f"  rep {rep + 1} read bandwidth {results[BANDWIDTH][-1] / 1e9:.1f} GB/s", flush=True)
        for engine in engines:
            for n_prompt, n_gen in tests:
                seconds = engine.run(n_prompt, n_gen, depth)
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
    print(f"\n| model | type | depth | engine | {pp} t/s | {tg} t/s | {pp} vs llama.cpp | "
          f"{tg} vs llama.cpp | {tg} vs HF best | {pp} / ceiling | {tg} / ceiling |")  # fmt: skip
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
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
            print(f"| {row['model']} | {row['type']} | {row['depth']} | {name} | {_fmt(p)} | "
                  f"{_fmt(t)} | {vs_pp} "
                  f"| {vs_tg} | {vs_hf} | {frac_pp} | {frac_tg} |")  # fmt: skip
        if not llama and row["quoted"]:
            qp, qt = row["quoted"]
            print(f"| {row['model']} | {row['type']} | 0 | llama.cpp (quoted, not "
                  f"this run) | {qp} | {qt} | - | - | - | {qp / ceil_pp:.0%} | "
                  f"{qt / ceil_tg:.0%} |")  # fmt: skip
    print("\nread bandwidth per round (GB/s; the tg / ceiling column uses these): " + "; ".join(
        f"{r['model']} {r['type']} d{r['depth']}: "
        + ", ".join(f"{b / 1e9:.1f}" for b in r["results"][BANDWIDTH])
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
    parser.add_argument(
        "-d", "--n-depth", default="0", help="depths (llama-bench's -d), e.g. 0,4096"
    )
    for part in ("k", "v"):
        parser.add_argument(f"-ct{part}", f"--cache-type-{part}", default="",
                            help=f"{part.upper()} cache type of both runtimes")  # fmt: skip
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
    parser.add_argument(
        "--tessera-exe",
        action="append",
        default=[],
        help="another tessera install as an engine, LABEL:PATH of its `tessera` executable "
        "(e.g. an older tree's, for a before/after run; one process per test, depth 0)",
    )
    args = parser.parse_args()

    import torch

    from tessera.plugin_manager import Runtime

    runtime = Runtime()
    limits = perf_limits.measure(args.threads)
    tests = [t for t in ((args.n_prompt, 0), (0, args.n_gen)) if sum(t)]  # -p 0: tg only
    depths = [int(d) for d in args.n_depth.split(",")]
    args.cache_types = (args.cache_type_k, args.cache_type_v)
    n_ctx = args.n_prompt + args.n_gen + max(depths) + 16
    rows = []
    for model in args.models.split(","):
        hf_results: dict = {}
        for i, qtype in enumerate(args.types.split(",")):
            path = perf_models.model_file(Path(args.work), runtime, model, qtype, args.vocab)
            print(f"\n{model} {qtype}: {path}", flush=True)
            engines = [
                TesseraEngine(path, runtime, args.threads, n_ctx, cache_types=args.cache_types)
            ]
            for label, env in variants(args.tessera_env):
                engines.append(TesseraEngine(path, runtime, args.threads, n_ctx, label, env,
                                             args.cache_types))  # fmt: skip
            for spec in args.tessera_exe:
                label, _, exe = spec.partition(":")
                if not label or not exe:
                    raise SystemExit(f"--tessera-exe wants LABEL:PATH, got '{spec}'")
                engines.append(TesseraBenchEngine(label, exe, path, args.threads))
            llama = llama_engine(args, path, n_ctx)
            engines += [llama] if llama else []
            if i == 0 and not args.no_hf:  # HF runs no GGUF types: once per model
                engines += [HFEngine(engines[0].model, d, args.threads) for d in ("f32", "bf16")]
            for depth in depths:
                results: dict = {}
                interleave(engines, tests, args.repetitions, results, args.threads, depth)
                if i == 0 and depth == depths[0]:
                    hf_results = {k: v for k, v in results.items() if k[0].startswith("HF")}
                cost = perf_limits.model_cost(path)
                rows.append({
                    "model": model, "type": qtype, "depth": depth, "results": results,
                    "llama": llama.name if llama else None, "hf": hf_results,
                    "quoted": QUOTED_LLAMA_CPP.get((model, qtype)) if not (args.vocab or depth)
                    else None,
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

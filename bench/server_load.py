"""Load test of ``tessera serve``, alone or side by side with llama.cpp's ``llama-server``
on the same GGUF (docs/server.md).

Starts the server(s) as subprocesses on free loopback ports with the same slots, threads,
batch sizes and attention setting, warms each up with one request per slot, then for each
client count runs a bounded number of streamed completions on each server in turn (the
order alternates from one client count to the next, so a drift in machine load hits
both). Every request is greedy and asks for exactly ``--max-tokens`` tokens
(``ignore_eos``), with the prompt cache off; a server that reports another token count
fails the request. Reports per server: output tokens/s, time to first token and
inter-token latency (p50/p95) and failed requests, and with llama-server the ratios
tessera/llama-server of tokens/s and of TTFT p95.

    .venv/bin/python bench/server_load.py --model default --clients 1,4,8 --requests 24
    .venv/bin/python bench/server_load.py --model qwen2-0.5b:Q4_0 --work /tmp/perfwork \\
        --llama-server /tmp/llama-build/bin/llama-server -t 2

``--model``: ``default`` (the bundled model), ``qwen2.5-0.5b-shape`` (random weights,
Qwen2.5-0.5B's sizes, bf16), ``SHAPE:TYPE`` (bench/perf_models.py's random-weight file
of a shape in a GGUF type, e.g. ``qwen2-0.5b:Q4_0``, the one bench/perf_vs_llamacpp.py
measures; kept in ``--work``) or a GGUF path. The servers are in bench/server_load_servers.py,
the clients in bench/server_load_client.py, the tables in bench/server_load_stats.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from batched_bench_rows import model_path  # noqa: E402 (bench/ is the script's directory)
from server_load_client import run_level
from server_load_servers import (
    Server,
    ServerFlags,
    cpu_model,
    llama_server_version,
    n_ctx_train,
    per_slot_ctx,
    slot_ctx_note,
    start_llama_server,
    start_tessera,
    tessera_version,
)
from server_load_stats import engine_table, scaling_lines, side_by_side

from tessera.plugin_manager import Runtime


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/tessera-bench"))
    ap.add_argument(
        "--work", type=Path, default=Path("/tmp/tessera-perf"), help="SHAPE:TYPE model files"
    )
    ap.add_argument("--clients", default="1,4,8,16", help="client counts, comma-separated")
    ap.add_argument("--requests", type=int, default=24, help="requests per client count")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--prompt-words", type=int, default=0, help="prompt length (0: a sentence)")
    ap.add_argument("--duration", type=float, default=300, help="seconds per client count")
    ap.add_argument("-np", "--parallel", type=int, default=0, help="slots (0: most clients)")
    ap.add_argument(
        "-c", "--ctx-size", type=int, default=0, help="tessera's -c (0: what the slots need)"
    )
    ap.add_argument("-t", "--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("-ctk", "--cache-type-k", default=None, help="both servers' K cache type")
    ap.add_argument("-ctv", "--cache-type-v", default=None, help="both servers' V cache type")
    ap.add_argument("--server-args", default="", help="extra flags for tessera serve")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama-server binary")
    ap.add_argument(
        "--llama-kvu",
        action="store_true",
        help="llama-server with one KV pool (-kvu -c as tessera); default: its -np default, "
        "the pool split across the slots, -c scaled so that a slot holds as many tokens",
    )
    ap.add_argument("--llama-args", default="", help="extra flags for llama-server")
    ap.add_argument(
        "--client",
        choices=["raw", "openai"],
        default="raw",
        help="raw: http.client and hand-read SSE (light); openai: the official client",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return ap.parse_args()


def _model(name: str, args: argparse.Namespace, runtime: Runtime) -> Path:
    """The GGUF of ``--model``: ``SHAPE:TYPE`` is bench/perf_models.py's file (made once
    in ``--work``), anything else as bench/batched_bench_rows.py reads it."""
    shape, sep, qtype = name.partition(":")
    if not sep:
        return model_path(name, args.cache_dir, runtime)
    import perf_models

    if qtype not in perf_models.TYPES:
        raise SystemExit(f"unknown type '{qtype}' in --model; use one of {list(perf_models.TYPES)}")
    return perf_models.model_file(args.work, runtime, shape, qtype, None)


def _check_args(args: argparse.Namespace, levels: list[int]) -> None:
    if args.llama_server is not None and not os.access(args.llama_server, os.X_OK):
        raise SystemExit(f"--llama-server {args.llama_server} is not an executable file")
    if args.parallel and args.parallel < max(levels):
        print(
            f"note: -np {args.parallel} < {max(levels)} clients: some requests queue",
            file=sys.stderr,
        )


def _measure(
    servers: list[Server], levels: list[int], n_slots: int, args: argparse.Namespace
) -> list[dict]:
    """Warm-up, then every client count on every server, the order alternating per count;
    each row also has the CPU seconds the idle server used meanwhile."""
    for s in servers:  # first-call costs stay out of the numbers; every slot once
        warm = run_level(s.name, s.url, n_slots, n_slots, 4, kind=args.client, first=100)
        if warm["failed"]:
            raise SystemExit(f"{s.name} failed its warm-up: {warm['failures'][0]}")
    rows = []
    for i, n in enumerate(levels):
        for s in servers if i % 2 == 0 else servers[::-1]:
            idle = [o for o in servers if o is not s]
            idle_cpu = sum(o.cpu_seconds() for o in idle)
            row = run_level(
                s.name,
                s.url,
                n,
                max(args.requests, n),
                args.max_tokens,
                duration=args.duration,
                kind=args.client,
                prompt_words=args.prompt_words,
            )
            # an idle server must not take the cores the measured one needs
            row["idle_server_cpu_s"] = sum(o.cpu_seconds() for o in idle) - idle_cpu
            print(
                f"  {s.name} {n} clients: {row['out_tok_per_s']:.1f} tok/s, "
                f"{row['failed']} failed; the idle server used "
                f"{row['idle_server_cpu_s']:.2f} CPU s in {row['wall_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            rows.append(row)
    return rows


def main() -> int:
    args = _args()
    levels = [int(c) for c in args.clients.split(",")]
    _check_args(args, levels)
    path = _model(args.model, args, Runtime())
    n_slots = args.parallel or max(levels)
    per_request = args.max_tokens + 64 + 2 * args.prompt_words  # prompt words: <= 2 tokens
    flags = ServerFlags(
        model=path,
        n_slots=n_slots,
        # llama.cpp pads a slot's context to a multiple of 256; so does the default here
        n_ctx=args.ctx_size or -(-n_slots * per_request // 256) * 256,
        threads=args.threads,
        batch_size=args.batch_size,
        ubatch_size=args.ubatch_size,
        flash_attn=args.flash_attn,
        cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v,
    )
    load_before = os.getloadavg()
    servers = []
    try:
        servers.append(start_tessera(flags, args.server_args.split()))
        if args.llama_server is not None:
            servers.append(
                start_llama_server(
                    args.llama_server, flags, args.llama_kvu, args.llama_args.split()
                )
            )
        slot_ctx = {s.name: per_slot_ctx(s) for s in servers}
        if len(servers) == 2:
            train = n_ctx_train(servers[1])
            ctx_note = slot_ctx_note(*slot_ctx.values(), train, per_request)
        else:
            ctx_note = f"one slot holds {slot_ctx['tessera']} tokens"
        rows = _measure(servers, levels, n_slots, args)
    finally:
        for s in servers:
            s.stop()
    meta = {
        "model": str(path),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "tessera": tessera_version(),
        "llama_server": llama_server_version(args.llama_server) if args.llama_server else None,
        "flags": " ".join(flags.common()),
        "context": {s.name: s.ctx_flags for s in servers},
        "per_slot_ctx": slot_ctx,
        "per_slot_ctx_note": ctx_note,
        "max_tokens": args.max_tokens,
        "client": args.client,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
    }
    _report(meta, rows, [s.name for s in servers])
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    if any(r["failed"] for r in rows):
        print("server logs: " + ", ".join(str(s.log) for s in servers))
        return 1
    for s in servers:
        s.log.unlink()
    return 0


def _report(meta: dict, rows: list[dict], engines: list[str]) -> None:
    print(f"CPU: {meta['cpu']} ({meta['cpu_count']} CPUs)")
    print(f"tessera {meta['tessera']}")
    if meta["llama_server"]:
        print(f"llama-server {meta['llama_server']}")
    print(f"model {meta['model']}; both servers: {meta['flags']}")
    for name, how in meta["context"].items():
        print(f"  {name}: {how}")
    print(f"  per-slot context: {meta['per_slot_ctx_note']}")
    prompts = {e: [r["prompt_tokens_mean"] for r in rows if r["engine"] == e] for e in engines}
    print(
        f"{meta['max_tokens']} tokens per request (greedy, ignore_eos, prompt cache off); "
        "prompt tokens per request: "
        + ", ".join(f"{e} {sum(v) / len(v):.1f}" for e, v in prompts.items() if v)
        + f"; client {meta['client']}; load average "
        f"{meta['load_avg_before'][0]:.1f} before, {meta['load_avg_after'][0]:.1f} after"
    )
    for e in engines:
        print(f"\n{e}:\n")
        print("\n".join(engine_table([r for r in rows if r["engine"] == e])))
    if len(engines) == 2:
        print(f"\n{engines[0]} / {engines[1]}:\n")
        print("\n".join(side_by_side(rows, *engines)))
    print()
    print("\n".join(scaling_lines(rows)))
    if len(engines) == 2:
        most = max(r["idle_server_cpu_s"] for r in rows)
        print(f"the idle server used at most {most:.2f} CPU s during one run of the other")
    for r in rows:
        for f in r["failures"]:
            print(f"FAILED ({r['engine']}, {r['clients']} clients): {f}")


if __name__ == "__main__":
    raise SystemExit(main())

"""``tessera batched-bench``: prompt and generation speed of B parallel sequences.

Same parameters, columns and formulas as llama.cpp's ``llama-batched-bench``. For every
combination of PP (prompt tokens per sequence, ``-npp``), TG (generated tokens per
sequence, ``-ntg``) and B (parallel sequences, ``-npl``):

- the prompt phase decodes B prompts of PP random tokens (one prompt copied to all B
  sequences with ``-pps``), in chunks of ``-b`` tokens; its wall time is T_PP;
- the generation phase decodes TG batches of B tokens, one per sequence; its time is T_TG;
- N_KV = PP + B*TG with a shared prompt, else B*(PP+TG) (cells the run fills);
- S_PP = (PP with a shared prompt, else B*PP) / T_PP; S_TG = B*TG / T_TG;
  T = T_PP + T_TG; S = N_KV / T.

The header line and every row say which KV attention path ran (rows or dense) and why.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import attrs
import numpy as np

from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

OUTPUT_FORMATS = ("md", "json", "jsonl")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got '{text}'"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got '{text}'")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera.cli.args import add_model_arguments

    g = parser.add_argument_group("batched bench")
    g.add_argument("-npp", type=_int_list, default=[128, 256, 512], help="prompt tokens, list")
    g.add_argument("-ntg", type=_int_list, default=[128, 256], help="generated tokens, list")
    g.add_argument("-npl", type=_int_list, default=[1, 2, 4, 8, 16, 32], help="parallel, list")
    g.add_argument("-pps", action="store_true", help="one prompt shared by all sequences (seq_cp)")
    g.add_argument(
        "-kvu", "--kv-unified", action="store_true", help="one KV cell pool for all sequences"
    )
    g.add_argument("--output-format", choices=OUTPUT_FORMATS, default="md")
    add_model_arguments(parser)


@attrs.frozen
class BenchResult:
    """One row of the table, in llama-batched-bench's terms."""

    pp: int
    tg: int
    pl: int
    n_kv: int
    t_pp: float
    speed_pp: float
    t_tg: float
    speed_tg: float
    t: float
    speed: float
    kv_path: str


def n_kv_required(pp: int, tg: int, pl: int, shared: bool) -> int:
    return pp + pl * tg if shared else pl * (pp + tg)


def _decode_chunks(ctx: Any, batch: Any) -> None:
    n_batch = ctx.params.n_batch
    for start in range(0, len(batch), n_batch):
        end = start + n_batch
        ctx.decode(
            type(batch)(
                batch.tokens[start:end],
                batch.positions[start:end],
                batch.seq_ids[start:end],
                batch.output[start:end],
            )
        )


def run_config(
    ctx: Any, pp: int, tg: int, pl: int, shared: bool, rng: np.random.Generator
) -> BenchResult:
    """Time one (PP, TG, B) combination on an empty cache; the cache is cleared after."""
    from tessera.engine.batch import Batch

    n_vocab = ctx.model.n_vocab
    n_prompts = 1 if shared else pl
    ctx.kv.clear()
    prompt = Batch.concat(
        [
            Batch.for_sequence(rng.integers(0, n_vocab, pp), 0, seq, "last")
            for seq in range(n_prompts)
        ]
    )
    t0 = time.perf_counter()
    if pp:
        _decode_chunks(ctx, prompt)
    t_pp = time.perf_counter() - t0
    if shared:
        for seq in range(1, pl):
            ctx.kv.seq_cp(0, seq)
    seqs = np.arange(pl)
    t0 = time.perf_counter()
    for i in range(tg):
        tokens = rng.integers(0, n_vocab, pl)
        ctx.decode(Batch(tokens, np.full(pl, pp + i), seqs, np.ones(pl, dtype=bool)))
    t_tg = time.perf_counter() - t0
    ctx.kv.clear()
    n_kv = n_kv_required(pp, tg, pl, shared)
    t = t_pp + t_tg
    return BenchResult(
        pp=pp,
        tg=tg,
        pl=pl,
        n_kv=n_kv,
        t_pp=t_pp,
        speed_pp=(pp if shared else pl * pp) / t_pp if t_pp else 0.0,
        t_tg=t_tg,
        speed_tg=pl * tg / t_tg if t_tg else 0.0,
        t=t,
        speed=n_kv / t if t else 0.0,
        kv_path=ctx.kv_path,
    )


def warm_up(ctx: Any) -> None:
    """One small decode first, as llama-batched-bench does (lazy setup is not timed)."""
    from tessera.engine.batch import Batch

    n = min(16, ctx.kv.n_ctx_seq, ctx.params.n_batch)
    ctx.decode(Batch.for_sequence(np.zeros(n, dtype=np.int32), 0, 0, "last"))
    ctx.kv.clear()


MD_HEADER = (
    "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s "
    "|      T s |    S t/s | kv path |\n"
    "|-------|--------|------|--------|----------|----------|----------|----------"
    "|----------|----------|---------|"
)


def md_row(r: BenchResult) -> str:
    return (
        f"| {r.pp:5d} | {r.tg:6d} | {r.pl:4d} | {r.n_kv:6d} | {r.t_pp:8.3f} | "
        f"{r.speed_pp:8.2f} | {r.t_tg:8.3f} | {r.speed_tg:8.2f} | {r.t:8.3f} | "
        f"{r.speed:8.2f} | {r.kv_path:7s} |"
    )


def settings(ctx: Any, shared: bool) -> dict[str, Any]:
    p, backend = ctx.params, ctx.model.backend
    return {
        "n_kv_max": p.n_ctx,
        "n_batch": p.n_batch,
        "n_ubatch": ctx.n_ubatch,
        "flash_attn": p.flash_attn,
        "is_pp_shared": int(shared),
        "kv_unified": int(p.kv_unified),
        "type_k": p.type_k or backend.dtype,
        "type_v": p.type_v or backend.dtype,
        "backend": f"{backend.name}/{backend.device}/{backend.dtype}",
        "kv_path": ctx.kv_path,
        "kv_path_reason": ctx.kv_path_reason,
    }


def run(args: argparse.Namespace, runtime: Any) -> int:
    from tessera.cli.args import load_model_from_args
    from tessera.engine.context import Context, ContextParams

    if args.ubatch_size > args.batch_size:
        raise TesseraError("-ub must not exceed -b")
    configs = [(pp, tg, pl) for pp in args.npp for tg in args.ntg for pl in args.npl]
    if any(pl < 1 for _, _, pl in configs):
        raise TesseraError("-npl values must be at least 1")
    n_seq_max = max(args.npl)
    if args.kv_unified:
        needed = max(n_kv_required(pp, tg, pl, args.pps) for pp, tg, pl in configs)
    else:  # each sequence has its own stream of n_ctx / n_seq_max cells
        needed = n_seq_max * max(pp + tg for pp, tg, _ in configs)
    model = load_model_from_args(args, runtime)
    params = ContextParams(
        n_ctx=args.ctx_size if args.ctx_size > 0 else max(needed, 16),
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_seq_max=n_seq_max,
        flash_attn=args.flash_attn,
        kv_unified=args.kv_unified,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
    )
    ctx = Context(model, params)
    head = settings(ctx, args.pps)
    if args.output_format == "md":
        print(", ".join(f"{k} = {v}" for k, v in head.items() if k != "kv_path_reason"))
        print(f"kv path: {ctx.kv_path} ({ctx.kv_path_reason})\n")
        print(MD_HEADER, flush=True)
    warm_up(ctx)
    rng = np.random.default_rng(0)
    results = []
    for pp, tg, pl in configs:
        if n_kv_required(pp, tg, pl, args.pps) > params.n_ctx:
            continue  # as llama-batched-bench: a combination that does not fit is skipped
        r = run_config(ctx, pp, tg, pl, args.pps, rng)
        row = {**head, **attrs.asdict(r)}
        results.append(row)
        if args.output_format == "md":
            print(md_row(r), flush=True)
        elif args.output_format == "jsonl":
            print(json.dumps(row), flush=True)
    if args.output_format == "json":
        print(json.dumps(results, indent=2))
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command(
            "batched-bench",
            "S_PP/S_TG/S of B parallel sequences (like llama-batched-bench)",
            add_arguments,
            run,
        )
    )

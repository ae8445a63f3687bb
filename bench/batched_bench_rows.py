"""Rows path vs dense-mask path of KV attention, measured in one process (docs/kv-rows.md).

Loads the model once, makes two contexts that differ only in ``TESSERA_KV_ROWS_DISABLE``
(unified KV cache, -fa on) and runs llama-batched-bench's combinations on both,
alternating which path goes first per combination so that load changes on a shared
machine hit both (after a warm-up of one full ubatch on each).

    .venv/bin/python bench/batched_bench_rows.py --model qwen2.5-0.5b-shape -npp 4096 \
        -ntg 32 -npl 1,4

``--model`` is a GGUF path, ``default`` (the bundled model) or ``qwen2.5-0.5b-shape``: a
random-weight qwen2 model with Qwen2.5-0.5B's sizes (vocabulary: the default model's),
written once to ``--cache-dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from tessera.engine.context import KV_ROWS_DISABLE_ENV, Context, ContextParams
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.batched_bench import (
    MD_HEADER,
    md_row,
    n_kv_required,
    run_config,
    warm_up,
)

QWEN25_05B = {
    "n_embd": 896,
    "n_layer": 24,
    "n_head": 14,
    "n_head_kv": 2,
    "n_ff": 4864,
    "head_dim": 64,
}


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def model_path(name: str, cache_dir: Path, runtime: Runtime) -> Path:
    if name == "default":
        return default_model_path()
    if name != "qwen2.5-0.5b-shape":
        return Path(name)
    path = cache_dir / "qwen2.5-0.5b-shape-bf16.gguf"
    if not path.exists():
        from tessera.testing.models import make_gguf

        cache_dir.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr)
        make_gguf(path, "qwen2", qtype="bf16", seed=0, runtime=runtime, **QWEN25_05B)
    return path


def make_context(model, n_ctx: int, n_seq_max: int, args, disable_rows: bool) -> Context:
    if disable_rows:
        os.environ[KV_ROWS_DISABLE_ENV] = "1"
    else:
        os.environ.pop(KV_ROWS_DISABLE_ENV, None)
    params = ContextParams(
        n_ctx=n_ctx,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_seq_max=n_seq_max,
        flash_attn="on",
        kv_unified=True,
    )
    ctx = Context(model, params)
    os.environ.pop(KV_ROWS_DISABLE_ENV, None)
    return ctx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b-shape")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/tessera-bench"))
    ap.add_argument("-npp", type=_ints, default=[4096])
    ap.add_argument("-ntg", type=_ints, default=[32])
    ap.add_argument("-npl", type=_ints, default=[1, 4])
    ap.add_argument("-b", "--batch-size", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=0)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--repeat", type=int, default=1, help="runs per combination and path")
    args = ap.parse_args()

    runtime = Runtime()
    path = model_path(args.model, args.cache_dir, runtime)
    model = load_model(path, runtime, runtime.create_backend("torch", "cpu", args.dtype))
    if args.threads > 0:
        model.backend.set_threads(args.threads)
    configs = [(pp, tg, pl) for pp in args.npp for tg in args.ntg for pl in args.npl]
    n_ctx = max(n_kv_required(pp, tg, pl, False) for pp, tg, pl in configs)
    contexts = {
        "rows": make_context(model, n_ctx, max(args.npl), args, disable_rows=False),
        "dense": make_context(model, n_ctx, max(args.npl), args, disable_rows=True),
    }
    for name, ctx in contexts.items():
        assert ctx.kv_path == name, (name, ctx.kv_path_reason)
        warm_up(ctx)
        # One full ubatch too: the first large matmuls and attention pay one-time setup.
        run_config(ctx, min(args.ubatch_size, n_ctx), 1, 1, False, np.random.default_rng(1))
    b = model.backend
    import torch

    print(
        f"model {path.name}, backend {b.name}/{b.device}/{b.dtype}, torch threads "
        f"{torch.get_num_threads()}, n_kv_max {n_ctx}, n_batch {args.batch_size}, "
        f"n_ubatch {args.ubatch_size}, unified KV, -fa on; started {time.strftime('%H:%M')}"
    )
    for name, ctx in contexts.items():
        print(f"  {name}: {ctx.kv_path_reason}")
    print()
    print(MD_HEADER, flush=True)
    rng = np.random.default_rng(0)
    results = {}
    runs = [(c, rep) for c in configs for rep in range(args.repeat)]
    for i, ((pp, tg, pl), _) in enumerate(runs):
        # Alternate which path goes first, so a drift in machine load hits both.
        for name in ("rows", "dense") if i % 2 == 0 else ("dense", "rows"):
            r = run_config(contexts[name], pp, tg, pl, False, rng)
            results.setdefault((pp, tg, pl, name), []).append(r)
            print(md_row(r), flush=True)
    print()
    print(f"best of {args.repeat} run(s) per path (highest S_PP and highest S_TG):\n")
    print(
        "| PP | TG | B | S_PP rows | S_PP dense | rows/dense "
        "| S_TG rows | S_TG dense | rows/dense |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for pp, tg, pl in configs:
        rows, dense = results[(pp, tg, pl, "rows")], results[(pp, tg, pl, "dense")]
        pp_r, pp_d = max(r.speed_pp for r in rows), max(r.speed_pp for r in dense)
        tg_r, tg_d = max(r.speed_tg for r in rows), max(r.speed_tg for r in dense)
        print(
            f"| {pp} | {tg} | {pl} | {pp_r:.2f} | {pp_d:.2f} | {pp_r / pp_d:.2f} | "
            f"{tg_r:.2f} | {tg_d:.2f} | {tg_r / tg_d:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

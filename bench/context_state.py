"""Context state save/load of a full context: batched transfers vs the per-tensor path.

    .venv/bin/python bench/context_state.py [--n-ctx 4096] [--device cpu] [--dtype f32]

Fills every cell of sequence 0 with random K/V (no forward pass: only the transfers and the
file are measured), then per path times ``get_n`` / ``set_n`` alone and the whole
``save_state`` / ``load_state``, best of ``--repeat`` runs, side by side.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from tessera.engine import state as context_state
from tessera.engine.context import Context, ContextParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    runtime = Runtime()
    tmp = Path(tempfile.mkdtemp())
    path = make_gguf(tmp / "m.gguf", "llama", n_embd=args.n_embd, n_layer=args.n_layer)
    if args.backend == "numpy":
        backend = runtime.create_backend("numpy")
    else:
        backend = runtime.create_backend(args.backend, device=args.device, dtype=args.dtype)
    model = load_model(path, runtime, backend)
    ctx = Context(model, ContextParams(n_ctx=args.n_ctx))
    cells = np.arange(args.n_ctx)
    tensors = [t for t in ctx.kv.k + ctx.kv.v if t is not None]
    rng = np.random.default_rng(0)
    for t in tensors:
        backend.set_rows(t, cells, backend.from_numpy(rng.standard_normal(tuple(t.shape))))
    ctx.kv.commit(cells, cells.astype(np.int32), np.zeros(args.n_ctx, dtype=np.int64))
    history = list(rng.integers(0, model.n_vocab, args.n_ctx))
    arrays = context_state.get_n(backend, tensors, [cells] * len(tensors))
    mib = sum(a.nbytes for a in arrays) / 2**20
    print(
        f"{backend.name}/{backend.device}/{backend.dtype}: n_ctx {args.n_ctx}, n_embd "
        f"{args.n_embd}, n_layer {args.n_layer}, {len(tensors)} tensors, {mib:.0f} MiB"
    )
    state = tmp / "state.bin"
    results = {}
    for label, disable in (("batched", "0"), ("per-tensor", "1")):
        os.environ[context_state.BATCHED_COPY_DISABLE_ENV] = disable
        results[label] = (
            best(
                lambda: context_state.get_n(backend, tensors, [cells] * len(tensors)), args.repeat
            ),
            best(
                lambda: context_state.set_n(backend, tensors, [cells] * len(tensors), arrays),
                args.repeat,
            ),
            best(lambda: ctx.save_state(state, 0, history), args.repeat),
            best(lambda: ctx.load_state(state, 0), args.repeat),
        )
    print(f"{'path':<12}{'get_n':>10}{'set_n':>10}{'save':>10}{'load':>10}   (seconds)")
    for label, row in results.items():
        print(f"{label:<12}" + "".join(f"{x:>10.4f}" for x in row))
    ratio = [p / b for b, p in zip(results["batched"], results["per-tensor"], strict=True)]
    print(f"{'speed-up':<12}" + "".join(f"{x:>9.2f}x" for x in ratio))


if __name__ == "__main__":
    main()

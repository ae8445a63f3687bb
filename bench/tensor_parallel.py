"""Tensor parallel on one machine: 1 rank vs 2 ranks (gloo) vs 2 ranks (pairwise).

    .venv/bin/python bench/tensor_parallel.py [--pp 512] [--tg 128] [--qtype f16]
        [--configs 1x1,2:torch-distributed,2:pairwise,1x2] [--model FILE]

Without ``--model`` it writes a random-weight model with Qwen2-0.5B's dims (n_embd 896,
24 layers, 14 query / 2 KV heads, FFN 4864; the vocabulary is the test vocabulary's 4096
rows, not 151936). Each config runs in freshly spawned processes, one per rank, each
with ``--threads`` torch threads (``1x2`` = one rank with two threads). pp = one ubatch
of ``--pp`` tokens, only the last row's logits; tg = ``--tg`` single-token decodes from
an empty cache; best of ``--reps``. It prints per config: t/s, collectives per token and
bytes per token (decode), time inside collectives, and for the 1-rank runs the time
inside split ops (matmul, attention), which the scaling model in
docs/tensor-parallel.md needs; then that model's prediction for 2 ranks next to the
measurement.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

QWEN2_05B = {"n_embd": 896, "n_layer": 24, "n_head": 14, "n_head_kv": 2, "n_ff": 4864}
SPLIT_OPS = ("matmul", "attention", "attention_rows")


def _timed(obj: Any, names: tuple[str, ...], acc: dict[str, float]) -> None:
    """Replace ``obj.<name>`` by a wrapper adding its wall time to ``acc[name]``."""
    for name in names:
        fn = getattr(obj, name)

        def wrapper(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - t0

        setattr(obj, name, wrapper)


def _comm_probe(comm: Any, backend: Any, n_embd: int, pp: int) -> dict[str, float]:
    """Seconds per all-reduce of one decode row and of one pp ubatch (median)."""
    out = {}
    for label, rows, reps in (("ar_row_s", 1, 200), ("ar_ubatch_s", pp, 5)):
        x = backend.from_numpy(np.ones((rows, n_embd), dtype=np.float32))
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            comm.all_reduce(x)
            times.append(time.perf_counter() - t0)
        out[label] = float(np.median(times))
    return out


def bench_rank(
    rank: int,
    world_size: int,
    master: str,
    path: str,
    communicator: str | None,
    pp: int,
    tg: int,
    threads: int,
    reps: int,
    dtype: str | None,
) -> Any:
    import torch

    from tessera.engine.batch import Batch
    from tessera.engine.context import Context, ContextParams
    from tessera.files.load import load_model
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.lockstep import TPContext, serve_worker
    from tessera.plugins.tensor_parallel.shard import attach, form_group, load_model_shard

    torch.set_num_threads(threads)
    runtime = Runtime()
    comm, probe = None, {}
    if world_size == 1:
        model = load_model(path, runtime, "torch", dtype=dtype)
    else:
        shard = load_model_shard(path, runtime, rank, world_size, "torch", dtype=dtype)
        group = form_group(runtime, shard, master, communicator=communicator, timeout_s=300)
        comm = group.comm
        model = attach(shard, comm)
        probe = _comm_probe(comm, model.backend, model.config.n_embd, pp)
        if rank != 0:
            serve_worker(model, comm)
            comm.close()
            return None
    split_time: dict[str, float] = {}
    comm_time: dict[str, float] = {}
    _timed(model.backend, SPLIT_OPS, split_time)
    if comm is not None:
        _timed(comm, ("_all_reduce", "_all_gather", "_broadcast"), comm_time)
    params = ContextParams(n_ctx=pp + tg + 16, n_batch=pp, n_ubatch=pp)
    ctx = Context(model, params) if comm is None else TPContext(model, params, comm)
    tokens = np.random.default_rng(0).integers(0, model.n_vocab, pp + tg).tolist()

    def phase(run: Any) -> tuple[float, dict[str, float], dict[str, float], dict[str, list[int]]]:
        best = None
        for _ in range(reps):
            ctx.kv.clear()
            split_time.clear()
            comm_time.clear()
            before = {k: list(v) for k, v in (comm.stats if comm else {}).items()}
            t0 = time.perf_counter()
            run()
            dt = time.perf_counter() - t0
            stats = {
                k: [v[0] - before.get(k, [0, 0])[0], v[1] - before.get(k, [0, 0])[1]]
                for k, v in (comm.stats if comm else {}).items()
            }
            if best is None or dt < best[0]:
                best = (dt, dict(split_time), dict(comm_time), stats)
        return best

    pp_result = phase(lambda: ctx.decode(Batch.for_sequence(tokens[:pp], 0, 0, "last")))

    def decode_tokens() -> None:
        for i in range(tg):
            ctx.decode(Batch([tokens[i]], [i], [0], [True]))

    tg_result = phase(decode_tokens)
    if comm is not None:
        ctx.stop()
        path_taken = comm.path
        comm.close()
    else:
        path_taken = ""
    return {"pp": pp_result, "tg": tg_result, "probe": probe, "path": path_taken}


def summarize(label: str, res: dict[str, Any], pp: int, tg: int) -> dict[str, Any]:
    (pp_s, pp_split, pp_comm, _), (tg_s, tg_split, tg_comm, tg_stats) = res["pp"], res["tg"]
    per_tok = {k: (v[0] / tg, v[1] / tg) for k, v in tg_stats.items()}
    return {
        "config": label,
        "pp_tps": pp / pp_s,
        "tg_tps": tg / tg_s,
        "pp_s": pp_s,
        "tg_s_per_token": tg_s / tg,
        "pp_split_s": sum(pp_split.values()),
        "tg_split_s_per_token": sum(tg_split.values()) / tg,
        "pp_comm_s": sum(pp_comm.values()),
        "tg_comm_s_per_token": sum(tg_comm.values()) / tg,
        "per_token": per_tok,
        "probe": res["probe"],
        "path": res["path"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: Qwen2-0.5B-shaped)")
    ap.add_argument("--qtype", default="f16", help="storage type of the generated model")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--dtype", default=None, help="compute dtype (default: the backend's)")
    ap.add_argument("--configs", default="1x1,2:torch-distributed,2:pairwise,1x2")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    args = ap.parse_args()

    from tessera.plugins.tensor_parallel.testing import RankError, run_group
    from tessera.testing import make_gguf

    path = args.model
    if path is None:
        path = str(Path(tempfile.mkdtemp()) / "qwen2-0.5b-shaped.gguf")
        make_gguf(path, "qwen2", qtype=args.qtype, seed=0, **QWEN2_05B)
    rows = []
    for config in args.configs.split(","):
        if "x" in config:  # one rank, N threads
            world, comm, threads = 1, None, int(config.split("x")[1])
        else:
            world_s, comm = config.split(":")
            world, threads = int(world_s), args.threads
        res = run_group(
            world,
            bench_rank,
            path,
            comm,
            args.pp,
            args.tg,
            threads,
            args.reps,
            args.dtype,
            timeout_s=1800,
        )[0]
        if isinstance(res, RankError):
            raise SystemExit(f"{config}: {res.type}: {res.message}")
        rows.append(summarize(config, res, args.pp, args.tg))
        r = rows[-1]  # printed at once: a long run keeps what it measured
        print(f"{config}: pp {r['pp_tps']:.1f} t/s, tg {r['tg_tps']:.2f} t/s", flush=True)
    print(f"model {path}, pp{args.pp} tg{args.tg}, best of {args.reps}")
    print("| config | pp t/s | tg t/s | collectives/token (tg) | bytes/token (tg) | "
          "comm ms/token (tg) | comm ms (pp) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        calls = sum(c for c, _ in r["per_token"].values())
        ar = r["per_token"].get("all_reduce", (0, 0))
        nbytes = sum(b for _, b in r["per_token"].values())
        print(
            f"| {r['config']} | {r['pp_tps']:.1f} | {r['tg_tps']:.2f} | {calls:.1f} "
            f"({ar[0]:.0f} all-reduce) | {nbytes:.0f} ({ar[1]:.0f} in all-reduce) | "
            f"{1e3 * r['tg_comm_s_per_token']:.2f} | {1e3 * r['pp_comm_s']:.1f} |"
        )
    base = next((r for r in rows if r["config"] == "1x1"), None)
    if base is not None:
        print("\nscaling model (docs/tensor-parallel.md): T_N = S/N + R + C_N")
        for r in rows:
            if r["config"].startswith("2:"):
                predict(base, r, args.pp)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


def predict(base: dict[str, Any], two: dict[str, Any], pp: int) -> None:
    """Print the model's 2-rank prediction from the 1-rank split/rest times and the
    communicator's measured all-reduce costs, next to the measured 2-rank time."""
    n_ar_tok = two["per_token"]["all_reduce"][0]
    other_tok = sum(c for k, (c, _) in two["per_token"].items() if k != "all_reduce")
    probe = two["probe"]
    for phase, total, split, comm, n in (
        ("tg", base["tg_s_per_token"], base["tg_split_s_per_token"],
         n_ar_tok * probe["ar_row_s"] + other_tok * probe["ar_row_s"], 1),
        ("pp", base["pp_s"], base["pp_split_s"],
         (n_ar_tok - 1) * probe["ar_ubatch_s"] + (1 + other_tok) * probe["ar_row_s"], pp),
    ):  # fmt: skip
        rest = total - split
        predicted = split / 2 + rest + comm
        measured = two["tg_s_per_token"] if phase == "tg" else two["pp_s"]
        print(
            f"  {two['config']} {phase}: S={1e3 * split:.1f} ms R={1e3 * rest:.1f} ms "
            f"C={1e3 * comm:.2f} ms -> predicted {n / predicted:.1f} t/s, measured "
            f"{n / measured:.1f} t/s ({measured / predicted:.2f}x of predicted time)"
        )


if __name__ == "__main__":
    main()

"""The native decode attention at depth: time per call and the process's peak memory as the
rows one query reads grow, for each cache storage type, next to torch's SDPA.

    .venv/bin/python bench/decode_attention_depth.py [--rows 1024,4096,16384,32768]
        [--types bf16,f16,q8_0] [-t 1,2] [--heads 14 --kv-heads 2 --head-dim 64] [-r 20]

One decode query (Qwen2.5-0.5B's heads by default) over ``rows`` cache cells, best of
``-r`` calls; ``ns/row`` staying flat says the cost is linear in the depth, and the peak RSS
staying put while the rows grow says the kernel's own memory does not grow with them
(flash-decoding: tiles of rows, an online softmax, a fixed buffer per thread).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.native import library
from tessera.backends.native.kernels import RowLists
from tessera.backends.torch import kv_store


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _best(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1024,4096,16384,32768")
    parser.add_argument("--types", default="bf16,f16,q8_0")
    parser.add_argument("-t", "--threads", default="1,2")
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("-r", "--repetitions", type=int, default=20)
    args = parser.parse_args()
    native = library.load(library.build())
    h, h_kv, d = args.heads, args.kv_heads, args.head_dim
    rows = [int(r) for r in args.rows.split(",")]
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; H={h} Hkv={h_kv} D={d}")
    print("| threads | cache | rows | native µs | ns/row | peak RSS growth KiB | SDPA µs |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for threads in (int(t) for t in args.threads.split(",")):
        native._threads = lambda n=threads: n
        torch.set_num_threads(threads)
        for kind in args.types.split(","):
            for r in rows:
                kf, vf = torch.randn(r, h_kv, d), torch.randn(r, h_kv, d)
                if kind == "q8_0":
                    k, v = kv_store.quantize(kf), kv_store.quantize(vf)
                else:
                    k, v = kf.to(kv_store.DTYPES[kind]), vf.to(kv_store.DTYPES[kind])
                q = torch.randn(1, h, d).bfloat16()
                lists = RowLists(np.arange(r)[None], np.zeros((1, 1), np.int64), None)
                shape = (r, h_kv, d)
                call = partial(native.attention_kv, q, k, kind, v, kind, shape, lists, d**-0.5)
                call()
                before = _peak_kib()
                seconds = _best(call, args.repetitions)
                grown = _peak_kib() - before
                sdpa = "-"
                if kind != "q8_0":  # SDPA over the same values in the compute dtype
                    qs = q.transpose(0, 1)[None]
                    ks, vs = (c.to(torch.bfloat16).transpose(0, 1)[None] for c in (k, v))
                    sdpa_call = partial(F.scaled_dot_product_attention, qs, ks, vs, enable_gqa=True)
                    sdpa = f"{_best(sdpa_call, max(args.repetitions // 4, 1)) * 1e6:.0f}"
                print(f"| {threads} | {kind} | {r} | {seconds * 1e6:.0f} | {seconds * 1e9 / r:.1f} "
                      f"| {grown} | {sdpa} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()

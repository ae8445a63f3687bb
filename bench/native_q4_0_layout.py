"""The Q4_0 decode GEMV on the file's layout against the 4-row layout, streaming from DRAM.

    .venv/bin/python bench/native_q4_0_layout.py [--shapes 4864x896,896x4864] [--mb 600]
        [--threads 2] [--rounds 7]

For each shape (n_out x n_in, the 0.5B model's FFN matrices by default): enough distinct
random weights to fill ``--mb`` MB (more than the last-level cache, so every call reads
DRAM), each in both layouts. A round times one pass of one-row matmuls over all weights in
one layout, then the other, then torch's sum over 1 GiB (bench/perf_limits.py's read
bandwidth, the ceiling); rounds alternate which layout goes first, so drift cancels. Prints
the median GB/s of weight bytes read per layout and its share of the median ceiling.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from perf_limits import read_bandwidth

from tessera.backends.native import cpu_paths, library, selftest


def one_pass(native, kind, weights, x) -> float:
    """Seconds for one one-row matmul by each weight."""
    start = time.perf_counter()
    for w in weights:
        native.matmul(kind, w, x)
    return time.perf_counter() - start


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4864x896,896x4864")
    parser.add_argument("--mb", type=float, default=600.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native = library.load(library.build())
    print(f"CPU: {cpu_paths.cpu_model()}; {args.threads} threads; {cpu_paths.describe(native)}")
    print(
        f"{'shape':>10} {'weights':>7} {'file GB/s':>9} {'4-row GB/s':>10} {'ceiling':>7}  shares"
    )
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        n_out, n_in = map(int, shape.split("x"))
        one = selftest._GgufOracle("Q4_0").quantize(
            rng.standard_normal((n_out, n_in)).astype(np.float32)
        )
        count = max(1, int(args.mb * 1e6 / one.nbytes))
        files = [torch.from_numpy(one)]
        files += [torch.roll(files[0], k, 0).contiguous() for k in range(1, count)]
        packed = [native.repack_q4_0_x4(w) for w in files]
        x = torch.from_numpy(rng.standard_normal((1, n_in)).astype(np.float32)).bfloat16()
        rates: dict[str, list[float]] = {"Q4_0": [], "Q4_0_x4": []}
        ceilings = []
        for r in range(args.rounds):
            order = (("Q4_0", files), ("Q4_0_x4", packed))
            for kind, weights in order if r % 2 == 0 else order[::-1]:
                one_pass(native, kind, weights, x)  # the other weights out of the caches
                rates[kind].append(count * one.nbytes / one_pass(native, kind, weights, x) / 1e9)
            ceilings.append(read_bandwidth(args.threads) / 1e9)
        a, b, c = (float(np.median(v)) for v in (rates["Q4_0"], rates["Q4_0_x4"], ceilings))
        print(
            f"{shape:>10} {count:7d} {a:9.1f} {b:10.1f} {c:7.1f}  {a / c:.0%} -> {b / c:.0%} "
            f"({b / a:.2f}x)"
        )


if __name__ == "__main__":
    main()

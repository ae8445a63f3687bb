"""The native decode GEMV of block types against their fallback, one weight, 1 and 2 threads.

    .venv/bin/python bench/native_block_gemv.py [--types IQ2_XXS,IQ1_M] [--repeat 200]

For each type: a weight of the 0.5B model's FFN size (4864 x 896 values; stored as the
down projection, 896 rows of 4864, because the 256-value super-blocks do not divide rows of
896) made of random block bytes, loaded by the torch backend (CPU, bf16) twice: on the
native kernels (the file's bytes, int8 dot products) and with them switched off for that
type (``TESSERA_NATIVE_QUANT_DISABLE``: the grid types then keep a dense bf16 copy). Prints
µs per one-row matmul (decode), the weight's bytes in memory, and the speed-up. Best of
``--repeat`` calls after a warm-up; the CPU's model name first.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from tessera.backends.native import cpu_paths, selftest
from tessera.backends.native.typed_gemv import GRID_TYPES
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

N_OUT, N_IN = 896, 4864


def load(runtime: Runtime, kind: str, raw: np.ndarray, native: bool):
    """A bf16 torch backend and the weight on it, native kernels on or off for ``kind``."""
    os.environ["TESSERA_NATIVE_QUANT_DISABLE"] = "" if native else kind
    backend = runtime.create_backend("torch", device="cpu", dtype="bf16")
    runtime.equip(backend)
    qt = runtime.quant_type_by_name(kind)
    weight = backend.load_weight(RawTensor("w", qt.ggml_type, (N_OUT, N_IN), raw.reshape(-1)), qt)
    return backend, weight


def best_us(backend, weight, threads: int, repeat: int) -> float:
    import torch

    backend.set_threads(threads)
    x = backend.from_numpy(np.random.default_rng(0).standard_normal((1, N_IN), np.float32))
    with torch.inference_mode():
        for _ in range(10):
            backend.matmul(x, weight)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            backend.matmul(x, weight)
            best = min(best, time.perf_counter() - start)
    return best * 1e6


def weight_bytes(weight) -> int:
    raw = getattr(weight, "raw", None)
    if raw is not None:
        return raw.numel() * raw.element_size()
    return weight.numel() * weight.element_size() if hasattr(weight, "numel") else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=",".join(GRID_TYPES))
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    runtime = Runtime()
    print(f"CPU: {cpu_paths.cpu_model()}; weight {N_OUT} x {N_IN}, 1 row, best of {args.repeat}")
    header = f"{'type':8} {'thr':>3} {'native µs':>10} {'fallback µs':>12} {'x':>6}"
    print(f"{header}  bytes native/fallback")
    for kind in args.types.split(","):
        raw = selftest.random_blocks(kind, N_OUT, N_IN, np.random.default_rng(1))
        fast, w_fast = load(runtime, kind, raw, native=True)
        path = fast.paths[f"quant decode GEMV {kind}"].path
        slow, w_slow = load(runtime, kind, raw, native=False)
        sizes = f"{weight_bytes(w_fast) / 2**20:.2f} / {weight_bytes(w_slow) / 2**20:.2f} MiB"
        for threads in (1, 2):
            a = best_us(fast, w_fast, threads, args.repeat)
            b = best_us(slow, w_slow, threads, args.repeat)
            print(f"{kind:8} {threads:3} {a:10.1f} {b:12.1f} {b / a:6.2f}  {sizes} ({path})")
    os.environ.pop("TESSERA_NATIVE_QUANT_DISABLE", None)


if __name__ == "__main__":
    main()

"""Physical limits of this machine for bench/perf_vs_llamacpp.py: what no runtime can beat.

- memory read bandwidth: a summed 1 GiB float32 tensor (far larger than the caches),
  measured once up front and again before every repetition round of the comparison (this
  shared machine's bandwidth drifts by 1.5x over minutes, so a decode result is set against
  the bandwidth measured next to it);
- matmul peak: square torch matmuls in float32 and bfloat16 (bf16 uses the AMX/AVX512
  matrix units where the CPU has them);
- decode ceiling of a GGUF file: bandwidth / bytes of the weights one token reads (every
  matrix once: the layers' and the output head; the embedding table only when it is the
  tied head); prefill ceiling: best matmul peak / (2 * matrix parameters of the layers).

Both ceilings ignore attention, which is small at these lengths; they are upper bounds.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class Limits:
    bandwidth: float  # bytes/s
    peak_f32: float  # FLOP/s
    peak_bf16: float

    @property
    def peak(self) -> float:
        return max(self.peak_f32, self.peak_bf16)


def _best_seconds(fn: Any, repeat: int) -> float:
    fn()  # warm-up: page faults, thread pool start
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(threads: int, repeat: int = 5, n: int = 2048) -> Limits:
    """Best of ``repeat`` runs (a busy machine only ever makes a run slower)."""
    import torch

    torch.set_num_threads(threads)
    bandwidth = read_bandwidth(threads, repeat)
    with torch.inference_mode():
        peaks = []
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            peaks.append(2 * n**3 / _best_seconds(lambda a=a, b=b: a @ b, repeat))
    return Limits(bandwidth, *peaks)


def read_bandwidth(threads: int, repeat: int = 3) -> float:
    """Bytes/s of the best of ``repeat`` sums of a 1 GiB float32 tensor on ``threads``."""
    import torch

    torch.set_num_threads(threads)
    with torch.inference_mode():
        big = torch.ones(1 << 28, dtype=torch.float32)
        return big.numel() * 4 / _best_seconds(big.sum, repeat)


@attrs.frozen
class ModelCost:
    decode_bytes: int  # weight bytes one generated token reads
    prefill_params: int  # matrix parameters of the layers (2 FLOPs each per token)


def model_cost(path: Path) -> ModelCost:
    """Bytes and parameters from the GGUF's tensor table (its stored types)."""
    from tessera.files.gguf import read_gguf

    tensors = read_gguf(path).tensors
    tied = "output.weight" not in tensors
    decode_bytes = prefill_params = 0
    for name, t in tensors.items():
        if len(t.shape) != 2:
            continue  # norms and biases: negligible
        if name == "token_embd.weight":
            if tied:
                decode_bytes += t.data.nbytes  # the output head reads all of it
            continue
        decode_bytes += t.data.nbytes
        if name != "output.weight":
            prefill_params += int(np.prod(t.shape))
    return ModelCost(decode_bytes, prefill_params)


def ceilings(limits: Limits, cost: ModelCost) -> tuple[float, float]:
    """``(prefill tokens/s, decode tokens/s)`` no runtime can exceed on this machine."""
    return limits.peak / (2 * cost.prefill_params), limits.bandwidth / cost.decode_bytes

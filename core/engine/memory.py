"""Refusing a KV cache the machine has no memory for, before allocating it.

The KV cache is the one large allocation a context makes (``n_ctx`` cells of K and V per
layer, in the compute dtype). On a CPU backend it is checked against what the kernel says
can be allocated without swapping (``MemAvailable`` in ``/proc/meminfo``), so a ``-c`` too
large for the machine is one sentence with the numbers and the way out instead of an OOM
kill. Where the figure is unknown (not Linux, a GPU device) nothing is checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.contract.arch import KVLayerLayout
from tessera.errors import TesseraError

#: Bytes per value of each compute dtype.
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


class OutOfMemoryError(TesseraError):
    """An allocation that the machine's free memory cannot hold."""


def available_bytes() -> int | None:
    """Memory that can be allocated without swapping (``MemAvailable``), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def kv_cache_bytes(layout: Sequence[KVLayerLayout | None], n_ctx: int, dtype: str) -> int:
    """Bytes of the K and V tensors of ``n_ctx`` cells over ``layout`` (shared layers: none)."""
    per_cell = sum(L.n_head_kv * (L.head_dim_k + L.head_dim_v) for L in layout if L is not None)
    return n_ctx * per_cell * DTYPE_BYTES.get(dtype, 4)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def check_kv_cache_fits(
    layout: Sequence[KVLayerLayout | None], n_ctx: int, dtype: str, available: int | None
) -> None:
    """Raise :class:`OutOfMemoryError` when the KV cache would not fit in ``available``."""
    need = kv_cache_bytes(layout, n_ctx, dtype)
    if available is not None and need > available:
        n_layers = sum(1 for L in layout if L is not None)
        raise OutOfMemoryError(
            f"a context of {n_ctx} tokens needs {_gib(need)} for its KV cache ({n_layers} "
            f"layers, {dtype}) but this machine has {_gib(available)} available; lower the "
            f"context size (-c {max(n_ctx * available // max(need, 1) // 2, 1)} would use "
            "about half of it) or free memory"
        )

"""Refusing weights or a KV cache the machine has no memory for, before allocating them.

The two large allocations are a model's weights (made when it loads) and a context's KV
cache (``n_ctx`` cells of K and V per layer, in the compute dtype or the ``-ctk`` / ``-ctv``
types). On a CPU backend each
is checked against what the kernel says can be allocated without swapping
(``MemAvailable`` in ``/proc/meminfo``), so a model or a ``-c`` too large for the machine
is one sentence with the numbers and the way out instead of an OOM kill; in a server with
several models (``--models-max``) each load is checked against what is left. Where the
figure is unknown (not Linux, a GPU device) nothing is checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tessera.contract.arch import KVLayerLayout
from tessera.engine.kv_types import KV_TYPE_BYTES
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


def kv_cache_bytes(
    layout: Sequence[KVLayerLayout | None],
    n_ctx: int,
    dtype: str,
    type_k: str = "",
    type_v: str = "",
) -> int:
    """Bytes of the K and V tensors of ``n_ctx`` cells over ``layout`` (shared layers: none;
    a V inside K, ``v_in_k``: none of its own), stored as ``type_k`` / ``type_v`` (a name of
    :data:`tessera.engine.kv_types.KV_TYPE_BYTES`; "": the compute ``dtype``)."""
    k_bytes = KV_TYPE_BYTES.get(type_k or dtype, 4)
    v_bytes = KV_TYPE_BYTES.get(type_v or dtype, 4)
    per_cell = sum(
        L.n_head_kv * (L.head_dim_k * k_bytes + (0 if L.v_in_k else L.head_dim_v * v_bytes))
        for L in layout
        if L is not None
    )
    return math.ceil(n_ctx * per_cell)


def weight_bytes(
    tensors: Mapping[str, Any], qtypes: Mapping[str, Any], backend: Any, kernels: Mapping
) -> int:
    """Bytes the backend keeps for these weights: a 2-D tensor that a weight kernel of
    ``kernels`` (keyed ``(backend, quant type)``) takes stays about its stored size;
    anything else is dequantized to the compute dtype. A lower bound for kernels that
    repack (a few bytes per block more), exact for the dequantized rest."""
    value_bytes = DTYPE_BYTES.get(backend.dtype, 4)
    total = 0
    for name, raw in tensors.items():
        kernel = kernels.get((backend.name, qtypes[name].name))
        if kernel is not None and len(raw.shape) == 2 and kernel.supports(backend):
            total += raw.data.nbytes
        else:
            total += math.prod(raw.shape) * value_bytes
    return total


def check_weights_fit(need: int, n_tensors: int, dtype: str, available: int | None) -> None:
    """Raise :class:`OutOfMemoryError` when ``need`` bytes of weights would not fit."""
    if available is not None and need > available:
        raise OutOfMemoryError(
            f"this model's {n_tensors} tensors need {_gib(need)} in memory ({dtype} compute) "
            f"but this machine has {_gib(available)} available; use a smaller quantization "
            "(tessera quantize), unload other models, or free memory"
        )


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def check_kv_cache_fits(
    layout: Sequence[KVLayerLayout | None],
    n_ctx: int,
    dtype: str,
    available: int | None,
    type_k: str = "",
    type_v: str = "",
) -> None:
    """Raise :class:`OutOfMemoryError` when the KV cache would not fit in ``available``."""
    need = kv_cache_bytes(layout, n_ctx, dtype, type_k, type_v)
    if available is not None and need > available:
        n_layers = sum(1 for L in layout if L is not None)
        types = dtype if (type_k or dtype) == (type_v or dtype) == dtype else (
            f"K {type_k or dtype}, V {type_v or dtype}"
        )  # fmt: skip
        smaller = "" if "q8_0" in (type_k, type_v) else ", store it as q8_0 (-ctk/-ctv q8_0)"
        raise OutOfMemoryError(
            f"a context of {n_ctx} tokens needs {_gib(need)} for its KV cache ({n_layers} "
            f"layers, {types}) but this machine has {_gib(available)} available; lower the "
            f"context size (-c {max(n_ctx * available // max(need, 1) // 2, 1)} would use "
            f"about half of it){smaller} or free memory"
        )

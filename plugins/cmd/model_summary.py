"""The one line ``tessera run``, ``chat`` and ``serve`` print to stderr when a model starts.

It says what the model is (architecture, name, parameter count, stored tensor types), its
context, where it runs (backend, dtype, device), and every path the backend and the context
took with the reason each gives (weights kept quantized or dequantized, row-indexed or
dense attention, prefill pruning, native kernels ...), as ``tessera plugins`` reports them::

    model: llama 'hf' | 5.48M params | F16 x43, F32 x13 | n_ctx 512 | numpy/f32 on cpu |
    paths: weights: dequantize x43 (F16 decoded to f32 ...), dequantize x13 (...); kv
    attention: dense (backend numpy does not support attention_rows); prefill pruning: ...
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np


def parameter_count(model: Any) -> int:
    """Values in the model's tensors, from the architecture's shapes."""
    shapes = model.arch.tensor_shapes(model.config)
    return int(sum(int(np.prod(s)) for s in shapes.values()))


def _count(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}"
    return str(n)


def _types(model: Any) -> str:
    counts = Counter(getattr(model, "tensor_types", {}).values())
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common()) or "types unknown"


def backend_paths(model: Any) -> list[str]:
    """``what: path (reason)`` for every decision recorded on the model's backend: the
    per-tensor ones grouped (``weights: PATH xN (REASON)``), the others once each (the
    latest, as a second context records its own), then the backend's switched paths."""
    backend = model.backend
    weights: Counter[tuple[str, str]] = Counter()
    named: dict[str, tuple[str, str]] = {}
    for what, path, reason in backend.placements:
        if what in model.weights:
            weights[(path, reason)] += 1
        else:
            named[what] = (path, reason)
    groups = [f"{path} x{n} ({reason})" for (path, reason), n in weights.most_common()]
    lines = ["weights: " + ", ".join(groups)] if groups else []
    lines += [f"{what}: {path} ({reason})" for what, (path, reason) in named.items()]
    lines += [f"{what}: {choice}" for what, choice in backend.paths.items()]
    return lines


def model_summary(model: Any, ctx: Any = None) -> str:
    """The line (see the module docstring); ``ctx`` adds the context's size."""
    name = model.metadata.get("general.name") or Path(model.path).name
    arch = model.metadata.get("general.architecture") or type(model.config).__name__
    backend = model.backend
    parts = [
        f"model: {arch} '{name}'",
        f"{_count(parameter_count(model))} params",
        _types(model),
    ]
    if ctx is not None:
        parts.append(f"n_ctx {ctx.n_ctx}")
    parts.append(f"{backend.name}/{backend.dtype} on {backend.device}")
    paths = backend_paths(model)
    if paths:
        parts.append("paths: " + "; ".join(paths))
    return " | ".join(parts)

"""The torch backend's routed-experts op (``moe_ffn``), kept apart from the core ops.

Each distinct selected expert runs once, on exactly the rows that chose it (gathered with
``index_select``, scattered back with ``index_add_``); a decode step (one row) skips the
gather and scatter. Sums are taken in float32, like the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


def moe_ffn(
    backend: Any, x: torch.Tensor, expert_ids: np.ndarray, expert_weights: np.ndarray, experts: Any
) -> torch.Tensor:
    expert_ids = np.asarray(expert_ids)
    weights = np.asarray(expert_weights, dtype=np.float32)
    used = np.unique(expert_ids)
    loaded = experts.get(used.tolist())
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    single = x.shape[0] == 1
    for e, (gate, up, down) in zip(used, loaded, strict=True):
        rows, slot = np.nonzero(expert_ids == e)  # a row picks an expert at most once
        h = x if single else x.index_select(0, idx := backend._index(rows))
        act = F.silu(backend.matmul(h, gate)) * backend.matmul(h, up)
        y = backend.matmul(act, down).float()
        if single:  # one row: its weight is a Python scalar, no tensor to build and move
            out += y * float(weights[0, slot[0]])
        else:
            scale = torch.from_numpy(weights[rows, slot]).to(x.device)[:, None]
            out.index_add_(0, idx, y * scale)
    return out.to(x.dtype)

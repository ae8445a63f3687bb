"""gpt-oss's routed experts, as llama.cpp's ``build_moe_ffn`` runs them for ``gpt-oss``.

The router (``ffn_gate_inp`` with its bias) scores the experts; the top ``k`` logits are
kept and their softmax weighs the chosen experts (llama.cpp's ``SOFTMAX_WEIGHT`` gating,
transformers' ``GptOssTopKRouter``). Each expert is ``down(swiglu_oai(gate(x), up(x)))``
with a bias after each projection (``ffn_{gate,up,down}_exps.bias``, one row per expert)
and the clamped SwiGLU of :meth:`tessera.contract.optional_ops.OptionalOps.swiglu_oai`.

The ``moe_ffn`` op knows plain SwiGLU experts only, so they are composed from core ops:
each chosen expert runs once, on the rows that chose it (``get_rows``); its weighted
output is written into one buffer per routing slot (``set_rows``: a row has one expert in
each slot), and the ``k`` buffers are summed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def route(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Expert ids ``(T, k)`` int32 (best first) and their weights ``(T, k)`` float32: the
    softmax of the ``k`` largest logits of each row."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, ids, axis=-1)
    weights = np.exp(chosen - chosen[:, :1])  # the first is the largest
    return ids.astype(np.int32), (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def routed_experts(
    b: Any,
    x: Any,
    ids: np.ndarray,
    weights: np.ndarray,
    experts: Any,
    biases: tuple[Any, Any, Any],
    alpha: float,
    limit: float,
) -> Any:
    """``sum_j weights[t, j] * expert_{ids[t, j]}(x_t)`` for every row ``t`` of ``x``
    ``(T, n_embd)``. ``experts`` is the layer's :class:`tessera.contract.experts.ExpertWeights`,
    ``biases`` the loaded ``(n_expert, rows)`` gate, up and down bias stacks."""
    n_tokens, k = ids.shape
    used = np.unique(ids)
    slots = None if n_tokens == 1 else [b.zeros(tuple(x.shape)) for _ in range(k)]
    out = None
    for e, (gate, up, down) in zip(used, experts.get(used.tolist()), strict=True):
        rows, slot = np.nonzero(ids == e)  # a row picks an expert at most once
        h = x if n_tokens == 1 else b.get_rows(x, rows)
        row = np.array([e])
        g = b.add(b.matmul(h, gate), b.get_rows(biases[0], row))
        u = b.add(b.matmul(h, up), b.get_rows(biases[1], row))
        y = b.add(b.matmul(b.swiglu_oai(g, u, alpha, limit), down), b.get_rows(biases[2], row))
        y = b.mul(y, b.from_numpy(weights[rows, slot][:, None]))
        if slots is None:  # decode: one row, summed as it comes
            out = y if out is None else b.add(out, y)
            continue
        for j in np.unique(slot):
            pick = np.nonzero(slot == j)[0]
            b.set_rows(slots[j], rows[pick], y if len(pick) == len(rows) else b.get_rows(y, pick))
    if slots is None:
        return out
    out = slots[0]
    for s in slots[1:]:
        out = b.add(out, s)
    return out

"""Conformance cases of ``moe_ffn`` (an optional op): routed SwiGLU experts over stacked
expert weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.arrays import normal
from tessera.testing.conformance.kit import Case, Weight

#: ``moe_ffn`` cases: (rows, experts, experts used per row, expert FFN size).
_MOE_SHAPES = ((1, 8, 2, 64), (7, 8, 2, 64), (33, 6, 4, 32))


def _moe_inputs(rng, n_tokens, n_expert, k, n_ff, qtype, n_embd=64):
    # Each row picks k distinct experts; the last expert is never picked, so a backend
    # that computes unselected experts (or reads their weights) is still right but the
    # op's contract is exercised with a hole in the selection.
    ids = np.stack([rng.permutation(n_expert - 1)[:k] for _ in range(n_tokens)])
    weights = rng.random((n_tokens, k)).astype(np.float32) + np.float32(0.1)
    return {
        "x": normal(rng, n_tokens, n_embd),
        "gate": Weight(normal(rng, n_expert, n_ff, n_embd, scale=0.2), qtype),
        "up": Weight(normal(rng, n_expert, n_ff, n_embd, scale=0.2), qtype),
        "down": Weight(normal(rng, n_expert, n_embd, n_ff, scale=0.2), qtype),
        "ids": ids.astype(np.int32),
        "routing": [weights / weights.sum(-1, keepdims=True)],  # a list: stays numpy
    }


def moe_ffn_cases(qtypes: list[Any]) -> list[Case]:
    """Routed SwiGLU experts (an optional op) over stacked expert weights."""
    from tessera.contract.experts import StackedExperts

    cases = []
    for qt in [q for q in qtypes if q.name in ("F32", "Q8_0")]:
        for n_tokens, n_expert, k, n_ff in _MOE_SHAPES:
            cases.append(
                Case(
                    f"moe_ffn-{qt.name}-T{n_tokens}-E{n_expert}-K{k}-F{n_ff}",
                    "moe_ffn",
                    {"n_expert": n_expert, "n_expert_used": k, "quant_type": qt.name},
                    lambda rng, t=n_tokens, e=n_expert, k=k, f=n_ff, qt=qt: _moe_inputs(
                        rng, t, e, k, f, qt
                    ),
                    lambda b, a: b.moe_ffn(
                        a["x"],
                        a["ids"],
                        a["routing"][0],
                        StackedExperts(a["gate"], a["up"], a["down"]),
                    ),
                    (n_tokens, 64),
                )
            )
    return cases

"""Conformance cases of ``rms_norm`` (rows of very different scales, per-head rows) and
``layer_norm`` (a mean far from zero)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.arrays import normal
from tessera.testing.conformance.kit import Case


def _unit_rms(got: np.ndarray, args: dict[str, Any]) -> str | None:
    rms = np.sqrt(np.mean(got.astype(np.float64) ** 2, axis=-1))
    return None if np.allclose(rms, 1.0, atol=2e-2) else f"rows have rms {rms.min():.3g}..."


def norm_cases() -> list[Case]:
    cases = []
    for shape, tag in (((7, 64), "T7-E64"), ((7, 4, 16), "T7-H4-D16")):
        for weighted in (False, True):
            name = "rms_norm-weight" if weighted else "rms_norm"
            cases.append(
                Case(
                    f"{name}-{tag}",
                    "rms_norm",
                    {"weight": weighted},
                    # rows of very different scales: the statistics must not lose precision
                    lambda rng, s=shape, w=weighted: {
                        "x": normal(rng, *s)
                        * np.float32(10.0) ** rng.integers(-2, 3, s[:-1] + (1,)),
                        "w": normal(rng, s[-1]) if w else None,
                    },
                    lambda b, a: b.rms_norm(a["x"], a["w"], 1e-6),
                    shape,
                    None if weighted else _unit_rms,
                )
            )
    for weighted in (False, True):
        cases.append(
            Case(
                f"layer_norm{'-weight-bias' if weighted else ''}-T7-E64",
                "layer_norm",
                {"weight": weighted, "bias": weighted},
                lambda rng, w=weighted: {
                    "x": normal(rng, 7, 64) + np.float32(5.0),  # a mean far from zero
                    "w": normal(rng, 64) if w else None,
                    "bias": normal(rng, 64) if w else None,
                },
                lambda b, a: b.layer_norm(a["x"], a["w"], a["bias"], 1e-5),
                (7, 64),
            )
        )
    return cases

"""Conformance cases of the recurrent layers' ops: ``sigmoid``, ``ssm_conv`` (a decode row
and a prefill of 9 rows, continuing a state) and ``gated_delta_net`` (one token, 7 and
70, more value heads than key heads); an op's output and its new state are compared as one
flattened array."""

from __future__ import annotations

import numpy as np

from tessera.testing.conformance.arrays import flat, normal
from tessera.testing.conformance.kit import Case


def _unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Rows of unit length, as the delta net's L2-normed keys and queries are."""
    x = normal(rng, *shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _delta_inputs(rng: np.random.Generator, n: int, hk: int, h: int, dk: int, dv: int) -> dict:
    return {
        "q": _unit(rng, n, hk, dk),
        "k": _unit(rng, n, hk, dk),
        "v": normal(rng, n, h, dv),
        # the gates are host arrays (a list keeps them numpy): log decays <= 0, strengths
        "gates": [
            -np.abs(normal(rng, n, h, scale=0.5)),
            rng.uniform(0.0, 1.0, (n, h)).astype(np.float32),
        ],
        "s": normal(rng, h, dk, dv, scale=0.3),
    }


def recurrent_cases() -> list[Case]:
    cases = [
        Case(
            "sigmoid-T7-E64",
            "sigmoid",
            {},
            lambda rng: {"x": normal(rng, 7, 64, scale=6.0)},
            lambda b, a: b.sigmoid(a["x"]),
            (7, 64),
        )
    ]
    channels, width = 40, 4
    for n in (1, 9):
        cases.append(
            Case(
                f"ssm_conv-T{n}-C{channels}-K{width}",
                "ssm_conv",
                {"n_channels": channels, "kernel": width},
                lambda rng, n=n: {
                    "x": normal(rng, n, channels),
                    "state": normal(rng, width - 1, channels),
                    "w": normal(rng, channels, width, scale=0.5),
                },
                lambda b, a: flat(b, list(b.ssm_conv(a["x"], a["state"], a["w"]))),
                ((n + width - 1) * channels,),
            )
        )
    hk, h, dk, dv = 2, 4, 16, 8
    for n in (1, 7, 70):  # 70: past one chunk of a chunked implementation
        cases.append(
            Case(
                f"gated_delta_net-T{n}-Hk{hk}-H{h}-Dk{dk}-Dv{dv}",
                "gated_delta_net",
                {"n_k_heads": hk, "n_v_heads": h},
                lambda rng, n=n: _delta_inputs(rng, n, hk, h, dk, dv),
                lambda b, a: flat(
                    b, list(b.gated_delta_net(a["q"], a["k"], a["v"], *a["gates"], a["s"]))
                ),
                (n * h * dv + h * dk * dv,),
            )
        )
    return cases

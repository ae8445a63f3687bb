"""Conformance cases of ``rope`` (both pair layouts, partial rotary dims, positions of
several sequences and far ones, a frequency scale) and ``rope_ext`` (per-pair divisors, a
magnitude scale on the rotated part of partially rotated heads)."""

from __future__ import annotations

import numpy as np

from tessera.testing.conformance.arrays import normal
from tessera.testing.conformance.kit import Case

ROPE_POSITIONS = {
    "seq": np.arange(7),
    "multi": np.array([0, 1, 2, 3, 0, 1, 2]),  # two sequences in one ubatch
    "far": np.array([0, 5, 1000, 4095, 30000, 77, 12]),
}


def rope_cases() -> list[Case]:
    cases = []
    for mode in ("normal", "neox"):
        for n_rot in (64, 32):
            for pos_kind, positions in ROPE_POSITIONS.items():
                for freq_scale in (1.0, 0.25):
                    suffix = f"-{pos_kind}" + ("-fs0.25" if freq_scale != 1.0 else "")
                    cases.append(
                        Case(
                            f"rope-{mode}-T7-H4-D64-R{n_rot}{suffix}",
                            "rope",
                            {
                                "n_rot": n_rot,
                                "head_dim": 64,
                                "neox": mode == "neox",
                                "freq_base": 10000.0,
                                "freq_scale": freq_scale,
                            },
                            lambda rng, p=positions: {"x": normal(rng, 7, 4, 64), "pos": p},
                            lambda b, a, r=n_rot, m=mode, fs=freq_scale: b.rope(
                                a["x"], a["pos"], r, 10000.0, m == "neox", fs
                            ),
                            (7, 4, 64),
                        )
                    )
    return cases


def rope_ext_cases() -> list[Case]:
    """``rope_ext``: per-pair divisors, with huge ones leaving pairs unrotated (Gemma 4)."""
    cases = []
    for mode in ("normal", "neox"):
        for kind in ("partial", "random"):
            for pos_kind in ("seq", "far"):
                cases.append(
                    Case(
                        f"rope_ext-{mode}-T7-H4-D64-R64-{kind}-{pos_kind}",
                        "rope_ext",
                        {"n_rot": 64, "head_dim": 64, "neox": mode == "neox"},
                        lambda rng, k=kind, p=ROPE_POSITIONS[pos_kind]: {
                            "x": normal(rng, 7, 4, 64),
                            "pos": p,
                            # a list, not an array: the factors are host data, never loaded
                            "ff": (
                                np.where(np.arange(32) < 8, 1.0, 1e30)
                                if k == "partial"
                                else rng.uniform(0.5, 4.0, 32)
                            ).tolist(),
                        },
                        lambda b, a, m=mode: b.rope_ext(
                            a["x"], a["pos"], 64, 1e6, m == "neox", 1.0, a["ff"]
                        ),
                        (7, 4, 64),
                    )
                )
    for mode in ("normal", "neox"):
        # YaRN / LongRoPE: factors and an attention factor; the 32 unrotated values of
        # each head must pass through unscaled
        cases.append(
            Case(
                f"rope_ext-{mode}-T7-H4-D64-R32-mscale-far",
                "rope_ext",
                {"n_rot": 32, "head_dim": 64, "neox": mode == "neox"},
                lambda rng: {
                    "x": normal(rng, 7, 4, 64),
                    "pos": ROPE_POSITIONS["far"],
                    "ff": rng.uniform(1.0, 16.0, 16).tolist(),
                },
                lambda b, a, m=mode: b.rope_ext(
                    a["x"], a["pos"], 32, 1e4, m == "neox", 0.5, a["ff"], mscale=1.19
                ),
                (7, 4, 64),
            )
        )
    return cases

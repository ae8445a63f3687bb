"""Conformance cases of the elementwise ops: ``add`` / ``mul`` with broadcasting, ``scale``,
the activations and ``swiglu``; ``concat`` (joining along the last axis) and gpt-oss's
clamped ``swiglu_oai``."""

from __future__ import annotations

from tessera.testing.conformance.arrays import normal
from tessera.testing.conformance.kit import Case


def elementwise_cases() -> list[Case]:
    shapes = {
        "same": ((7, 64), (7, 64)),
        "row": ((7, 64), (64,)),
        "col": ((7, 64), (7, 1)),
        "heads": ((7, 4, 16), (1, 4, 16)),
    }
    cases = []
    for op in ("add", "mul"):
        for kind, (sa, sb) in shapes.items():
            cases.append(
                Case(
                    f"{op}-{kind}-{'x'.join(map(str, sa))}-by-{'x'.join(map(str, sb))}",
                    op,
                    {"shape_a": sa, "shape_b": sb},
                    lambda rng, sa=sa, sb=sb: {"a": normal(rng, *sa), "b": normal(rng, *sb)},
                    lambda b, a, op=op: getattr(b, op)(a["a"], a["b"]),
                    sa,
                )
            )
    cases.append(
        Case(
            "scale-T7-E64-s0.125",
            "scale",
            {"s": 0.125},
            lambda rng: {"x": normal(rng, 7, 64)},
            lambda b, a: b.scale(a["x"], 0.125),
            (7, 64),
        )
    )
    for op in ("silu", "gelu", "gelu_erf"):
        cases.append(
            Case(
                f"{op}-T7-E64",
                op,
                {},
                lambda rng: {"x": normal(rng, 7, 64, scale=3.0)},
                lambda b, a, op=op: getattr(b, op)(a["x"]),
                (7, 64),
            )
        )
    cases.append(
        Case(
            "swiglu-T7-E64",
            "swiglu",
            {},
            lambda rng: {"g": normal(rng, 7, 64, scale=3.0), "u": normal(rng, 7, 64)},
            lambda b, a: b.swiglu(a["g"], a["u"]),
            (7, 64),
        )
    )
    return cases


def tanh_case() -> Case:
    return Case(
        "tanh-T7-E64",
        "tanh",
        {},
        lambda rng: {"x": normal(rng, 7, 64, scale=3.0)},
        lambda b, a: b.tanh(a["x"]),
        (7, 64),
    )


def concat_cases() -> list[Case]:
    """``concat`` of an MLA query's parts (heads of a latent and a RoPE part) and of a
    cached K row's (one head), and of three 2-D parts."""
    shapes = {
        "query": ((7, 4, 32), (7, 4, 8)),
        "k-row": ((1, 1, 32), (1, 1, 8)),
        "three": ((5, 16), (5, 3), (5, 9)),
    }
    cases = []
    for kind, parts in shapes.items():
        widths = "+".join(str(p[-1]) for p in parts)
        cases.append(
            Case(
                f"concat-{kind}-{'x'.join(map(str, parts[0][:-1]))}-D{widths}",
                "concat",
                {"shapes": parts},
                lambda rng, parts=parts: {f"x{i}": normal(rng, *p) for i, p in enumerate(parts)},
                lambda b, a: b.concat([a[k] for k in sorted(a)]),
                (*parts[0][:-1], sum(p[-1] for p in parts)),
            )
        )
    return cases


def swiglu_oai_case() -> Case:
    # gpt-oss's constants; inputs wide enough that both clamps (gate above 7, up beyond
    # +-7) take part, and very negative gates, whose sigmoid underflows, too
    alpha, limit = 1.702, 7.0
    return Case(
        "swiglu_oai-T7-E64-a1.702-l7",
        "swiglu_oai",
        {"alpha": alpha, "limit": limit},
        lambda rng: {"g": normal(rng, 7, 64, scale=30.0), "u": normal(rng, 7, 64, scale=8.0)},
        lambda b, a: b.swiglu_oai(a["g"], a["u"], alpha, limit),
        (7, 64),
    )

"""Conformance cases of the weight ops: ``matmul`` and ``get_rows`` on every weight type,
``linear`` (bias, activation, residual), ``matmul_n``, ``gate_up_swiglu`` and
``matmul_heads`` (a 3-D weight, one matrix per head)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.arrays import flat, matmul_width, normal
from tessera.testing.conformance.kit import Case, Weight


def matmul_cases(qtypes: list[Any]) -> list[Case]:
    cases = []
    for qt in qtypes:
        n_in = matmul_width(qt)
        n_out = 48
        for n_tokens in (1, 7, 33):
            cases.append(
                Case(
                    f"matmul-{qt.name}-T{n_tokens}-N{n_out}-K{n_in}",
                    "matmul",
                    {"quant_type": qt.name, "n_tokens": n_tokens, "n_out": n_out, "n_in": n_in},
                    lambda rng, qt=qt, t=n_tokens, k=n_in, n=n_out: {
                        "x": normal(rng, t, k),
                        "w": Weight(normal(rng, n, k, scale=0.1), qt),
                    },
                    lambda b, a: b.matmul(a["x"], a["w"]),
                    (n_tokens, n_out),
                )
            )
        ids = np.array([3, 0, n_out - 1, 3, 11])
        cases.append(
            Case(
                f"get_rows-{qt.name}-R{len(ids)}-N{n_out}-K{n_in}",
                "get_rows",
                {"quant_type": qt.name, "n_rows": len(ids)},
                lambda rng, qt=qt, k=n_in, n=n_out, ids=ids: {
                    "w": Weight(normal(rng, n, k), qt),
                    "ids": ids,
                },
                lambda b, a: b.get_rows(a["w"], a["ids"]),
                (len(ids), n_in),
            )
        )
    return cases


def linear_cases(qtypes: list[Any]) -> list[Case]:
    """``linear``: matmul plus a bias row, on every weight type (BERT's dense layers)."""
    cases = []
    for qt in qtypes:
        n_in = matmul_width(qt)
        cases.append(
            Case(
                f"linear-{qt.name}-T7-N48-K{n_in}",
                "linear",
                {"quant_type": qt.name},
                lambda rng, qt=qt, k=n_in: {
                    "x": normal(rng, 7, k),
                    "w": Weight(normal(rng, 48, k, scale=0.1), qt),
                    "bias": normal(rng, 48),
                },
                lambda b, a: b.linear(a["x"], a["w"], a["bias"]),
                (7, 48),
            )
        )
    f32 = next(qt for qt in qtypes if qt.name == "F32")
    for act in ("gelu", "gelu_erf"):  # BERT's FFN up projection
        cases.append(
            Case(
                f"linear-{act}-F32-T29-N96-K64",
                "linear",
                {"activation": act},
                lambda rng, f32=f32: {
                    "x": normal(rng, 29, 64),
                    "w": Weight(normal(rng, 96, 64, scale=0.2), f32),
                    "bias": normal(rng, 96),
                },
                lambda b, a, act=act: b.linear(a["x"], a["w"], a["bias"], activation=act),
                (29, 96),
            )
        )
    cases.append(  # a residual connection added to the dense output
        Case(
            "linear-residual-F32-T29-N48-K96",
            "linear",
            {},
            lambda rng, f32=f32: {
                "x": normal(rng, 29, 96),
                "w": Weight(normal(rng, 48, 96, scale=0.1), f32),
                "bias": normal(rng, 48),
                "residual": normal(rng, 29, 48),
            },
            lambda b, a: b.linear(a["x"], a["w"], a["bias"], residual=a["residual"]),
            (29, 48),
        )
    )
    return cases


def matmul_n_cases(qtypes: list[Any]) -> list[Case]:
    """``matmul_n``: three weights of one type on one input (Q/K/V-like: 48, 16 and 8
    outputs), biases on two of them; decode (1 row) and a small batch (7 rows)."""
    cases = []
    for qt in qtypes:
        n_in = matmul_width(qt)
        for n_tokens in (1, 7):
            cases.append(
                Case(
                    f"matmul_n-{qt.name}-T{n_tokens}-N48+16+8-K{n_in}",
                    "matmul_n",
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, k=n_in, t=n_tokens: {
                        "x": normal(rng, t, k),
                        **{
                            f"w{i}": Weight(normal(rng, n, k, scale=0.1), qt)
                            for i, n in enumerate((48, 16, 8))
                        },
                        "b0": normal(rng, 48),
                        "b2": normal(rng, 8),
                    },
                    lambda b, a: flat(
                        b, b.matmul_n(a["x"], [a["w0"], a["w1"], a["w2"]], [a["b0"], None, a["b2"]])
                    ),
                    (n_tokens * 72,),
                )
            )
    return cases


def gate_up_swiglu_cases(qtypes: list[Any]) -> list[Case]:
    """``gate_up_swiglu``: an FFN's gate and up weights of one type (64 outputs each) on
    one input; decode (1 row), a small batch (7) and a prefill-sized one (40 rows: fused
    kernels may take only larger row counts)."""
    cases = []
    for qt in qtypes:
        n_in = matmul_width(qt)
        for n_tokens in (1, 7, 40):
            cases.append(
                Case(
                    f"gate_up_swiglu-{qt.name}-T{n_tokens}-N64-K{n_in}",
                    "gate_up_swiglu",
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, k=n_in, t=n_tokens: {
                        "x": normal(rng, t, k),
                        "gate": Weight(normal(rng, 64, k, scale=0.1), qt),
                        "up": Weight(normal(rng, 64, k, scale=0.1), qt),
                    },
                    lambda b, a: b.gate_up_swiglu(a["x"], a["gate"], a["up"]),
                    (n_tokens, 64),
                )
            )
    return cases


def matmul_heads_cases(qtypes: list[Any]) -> list[Case]:
    """``matmul_heads`` on the weight types whose blocks divide its input width: MLA's
    ``attn_k_b`` (nope -> latent) and ``attn_v_b`` (latent -> value) shapes, decode and
    prefill."""
    cases = []
    for qt in qtypes:
        if 64 % qt.block_size:
            continue
        for n_tokens, n_head, n_out in ((1, 4, 32), (9, 3, 24)):
            cases.append(
                Case(
                    f"matmul_heads-{qt.name}-T{n_tokens}-H{n_head}-N{n_out}-K64",
                    "matmul_heads",
                    {"quant_type": qt.name, "n_head": n_head},
                    lambda rng, qt=qt, t=n_tokens, h=n_head, n=n_out: {
                        "x": normal(rng, t, h, 64),
                        "w": Weight(normal(rng, h, n, 64, scale=0.1), qt),
                    },
                    lambda b, a: b.matmul_heads(a["x"], a["w"]),
                    (n_tokens, n_head, n_out),
                )
            )
    return cases

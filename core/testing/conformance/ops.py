"""The cases of the backend conformance kit (:mod:`tessera.testing.conformance.kit`), per op.

Shapes are small but chosen to reach awkward paths: output rows that are not a multiple
of 16, ubatches of 1 (decode) and 33 rows (prefill), partial rotary dims, grouped-query
ratios 1/2/4, several sequences in one mask, a query with no visible cell, and KV cells
past ``n_kv`` filled with NaN (an op that reads them fails). ``attention_rows`` cases
(an optional op) use real row lists from :meth:`tessera.engine.kv_cache.KVCache.rows`: ragged
sequences, padding, a sequence with nothing to see yet, GQA and a sliding window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.kit import Case, Weight


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _matmul_inputs(qt: Any) -> int:
    """Input width of the matmul-like cases: 256, or 4 blocks of a type whose block does
    not divide 256."""
    return 256 if 256 % qt.block_size == 0 else 4 * qt.block_size


def matmul_cases(qtypes: list[Any]) -> list[Case]:
    cases = []
    for qt in qtypes:
        n_in = _matmul_inputs(qt)
        n_out = 48
        for n_tokens in (1, 7, 33):
            cases.append(
                Case(
                    f"matmul-{qt.name}-T{n_tokens}-N{n_out}-K{n_in}",
                    "matmul",
                    {"quant_type": qt.name, "n_tokens": n_tokens, "n_out": n_out, "n_in": n_in},
                    lambda rng, qt=qt, t=n_tokens, k=n_in, n=n_out: {
                        "x": _normal(rng, t, k),
                        "w": Weight(_normal(rng, n, k, scale=0.1), qt),
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
                    "w": Weight(_normal(rng, n, k), qt),
                    "ids": ids,
                },
                lambda b, a: b.get_rows(a["w"], a["ids"]),
                (len(ids), n_in),
            )
        )
    return cases


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
                    lambda rng, sa=sa, sb=sb: {"a": _normal(rng, *sa), "b": _normal(rng, *sb)},
                    lambda b, a, op=op: getattr(b, op)(a["a"], a["b"]),
                    sa,
                )
            )
    cases.append(
        Case(
            "scale-T7-E64-s0.125",
            "scale",
            {"s": 0.125},
            lambda rng: {"x": _normal(rng, 7, 64)},
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
                lambda rng: {"x": _normal(rng, 7, 64, scale=3.0)},
                lambda b, a, op=op: getattr(b, op)(a["x"]),
                (7, 64),
            )
        )
    cases.append(
        Case(
            "swiglu-T7-E64",
            "swiglu",
            {},
            lambda rng: {"g": _normal(rng, 7, 64, scale=3.0), "u": _normal(rng, 7, 64)},
            lambda b, a: b.swiglu(a["g"], a["u"]),
            (7, 64),
        )
    )
    return cases


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
                        "x": _normal(rng, *s)
                        * np.float32(10.0) ** rng.integers(-2, 3, s[:-1] + (1,)),
                        "w": _normal(rng, s[-1]) if w else None,
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
                    "x": _normal(rng, 7, 64) + np.float32(5.0),  # a mean far from zero
                    "w": _normal(rng, 64) if w else None,
                    "bias": _normal(rng, 64) if w else None,
                },
                lambda b, a: b.layer_norm(a["x"], a["w"], a["bias"], 1e-5),
                (7, 64),
            )
        )
    return cases


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
                            lambda rng, p=positions: {"x": _normal(rng, 7, 4, 64), "pos": p},
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
                            "x": _normal(rng, 7, 4, 64),
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
    return cases


def tanh_case() -> Case:
    return Case(
        "tanh-T7-E64",
        "tanh",
        {},
        lambda rng: {"x": _normal(rng, 7, 64, scale=3.0)},
        lambda b, a: b.tanh(a["x"]),
        (7, 64),
    )


def _attention_mask(kind: str, n_tokens: int, n_kv: int) -> np.ndarray:
    # Queries are the last n_tokens cells written; cell c holds position c.
    q_pos = np.arange(n_kv - n_tokens, n_kv)
    mask = np.arange(n_kv)[None, :] <= q_pos[:, None]
    if kind == "multi":  # cells and queries alternate between two sequences
        mask &= (np.arange(n_kv)[None, :] % 2) == (q_pos[:, None] % 2)
    if kind == "masked-row":
        mask[2] = False
    return mask


def _masked_rows_zero(got: np.ndarray, args: dict[str, Any]) -> str | None:
    dead = ~args["mask"].any(axis=1)
    return "a query with no visible cell did not give zeros" if np.any(got[dead] != 0) else None


def attention_cases() -> list[Case]:
    cases = []
    n_tokens, n_cells, n_kv, n_head_kv, head_dim = 5, 16, 12, 2, 32
    shapes = [(g, head_dim) for g in (1, 2, 4)] + [(2, 16)]
    for kind in ("causal", "multi", "masked-row"):
        for group, dim_v in shapes:
            n_head = n_head_kv * group
            mask = _attention_mask(kind, n_tokens, n_kv)
            dv = f"-Dv{dim_v}" if dim_v != head_dim else ""
            cases.append(
                Case(
                    f"attention-{kind}-T{n_tokens}-Hq{n_head}-Hkv{n_head_kv}-D{head_dim}{dv}-kv{n_kv}",
                    "attention",
                    {
                        "n_head": n_head,
                        "n_head_kv": n_head_kv,
                        "head_dim": head_dim,
                        "head_dim_v": dim_v,
                        "n_kv": n_kv,
                        "n_tokens": n_tokens,
                    },
                    lambda rng, h=n_head, dv=dim_v, m=mask: _attention_inputs(
                        rng, n_tokens, h, n_head_kv, head_dim, dv, n_cells, n_kv, m
                    ),
                    lambda b, a: b.attention(
                        a["q"], a["k"], a["v"], n_kv, a["mask"], 1.0 / np.sqrt(head_dim)
                    ),
                    (n_tokens, n_head * dim_v),
                    _masked_rows_zero,
                )
            )
    return cases


def _attention_inputs(rng, n_tokens, n_head, n_head_kv, head_dim, dim_v, n_cells, n_kv, mask):
    k = _normal(rng, n_cells, n_head_kv, head_dim)
    v = _normal(rng, n_cells, n_head_kv, dim_v)
    k[n_kv:] = np.nan  # cells past n_kv must never be read
    v[n_kv:] = np.nan
    return {"q": _normal(rng, n_tokens, n_head, head_dim), "k": k, "v": v, "mask": mask}


#: Cache contents for ``attention_rows`` cases: (seq, first pos, n tokens) per fill, in order.
#: Cell 0 is freed afterwards and holds NaN, as do cells past n_kv: padding rows (clamped
#: to any index) and cells of other sequences must never be read.
_ROWS_FILLS = [(0, 0, 5), (1, 0, 9), (2, 0, 3), (0, 5, 4), (3, 6, 7), (1, 9, 2)]
_ROWS_QUERIES = {
    # (positions, seq_ids) of the ubatch's queries
    "ragged": ([8, 3, 5, 2, 7, 10, 6, 1], [0, 1, 1, 2, 1, 1, 3, 2]),
    "decode": ([9, 11, 3, 13], [0, 1, 2, 3]),
    "dead-query": ([4, 2, 8], [3, 3, 0]),  # seq 3 holds positions 6.. only
    "prompt": ([0, 1, 2], [2, 2, 2]),  # one sequence's queries over exactly its own rows
}


def _rows_inputs(rng, kind, n_head, n_head_kv, head_dim, window):
    from tessera.engine.kv_cache import KVCache

    n_cells = 40
    cache = KVCache(None, [None], n_cells, 4)  # cell bookkeeping only
    cache.commit(np.array([0]), np.array([0]), np.array([3]))
    for seq, start, n in _ROWS_FILLS:
        cache.commit(cache.find_slot(n), np.arange(start, start + n), np.full(n, seq))
    cache.release(np.array([0]))
    positions, seq_ids = (np.array(a) for a in _ROWS_QUERIES[kind])
    kv_rows = cache.rows(positions, seq_ids, cache.n_kv(), window)
    k = _normal(rng, n_cells, n_head_kv, head_dim)
    v = _normal(rng, n_cells, n_head_kv, head_dim)
    unused = np.setdiff1d(np.arange(n_cells), kv_rows.rows[kv_rows.rows >= 0])
    k[unused] = np.nan
    v[unused] = np.nan
    q = _normal(rng, len(positions), n_head, head_dim)
    return {"q": q, "k": k, "v": v, "rows": kv_rows}


def _rows_dead_queries_zero(got: np.ndarray, args: dict[str, Any]) -> str | None:
    rows = args["rows"]
    dead = ~rows.allowed().any(-1).ravel()[rows.q_index]
    return "a query with no allowed row did not give zeros" if np.any(got[dead] != 0) else None


def attention_rows_cases() -> list[Case]:
    cases = []
    n_head_kv, head_dim = 2, 32
    for kind, (positions, _) in _ROWS_QUERIES.items():
        for group in (1, 2, 4):
            for window in (0, 4):
                n_head, n_tokens = n_head_kv * group, len(positions)
                swa = f"-swa{window}" if window else ""
                cases.append(
                    Case(
                        f"attention_rows-{kind}-T{n_tokens}-Hq{n_head}-Hkv{n_head_kv}-D{head_dim}{swa}",
                        "attention_rows",
                        {
                            "n_head": n_head,
                            "n_head_kv": n_head_kv,
                            "head_dim": head_dim,
                            "window": window,
                            "n_tokens": n_tokens,
                        },
                        lambda rng, k=kind, h=n_head, w=window: _rows_inputs(
                            rng, k, h, n_head_kv, head_dim, w
                        ),
                        lambda b, a: b.attention_rows(
                            a["q"], a["k"], a["v"], a["rows"], 1.0 / np.sqrt(head_dim)
                        ),
                        (n_tokens, n_head * head_dim),
                        _rows_dead_queries_zero,
                    )
                )
    return cases


def _other_rows_kept(got: np.ndarray, args: dict[str, Any]) -> str | None:
    kept = np.setdiff1d(np.arange(len(got)), args["rows"])
    return None if np.all(got[kept] == 0) else "set_rows changed rows it was not given"


def set_rows_case() -> Case:
    rows = np.array([5, 0, 9])
    return Case(
        "set_rows-C16-R3-H2-D8",
        "set_rows",
        {"n_rows": 3},
        lambda rng: {
            "dst": np.zeros((16, 2, 8), np.float32),
            "rows": rows,
            "src": _normal(rng, 3, 2, 8),
        },
        lambda b, a: (b.set_rows(a["dst"], a["rows"], a["src"]), a["dst"])[1],
        (16, 2, 8),
        _other_rows_kept,
    )


#: Rows per tensor of the batched-transfer cases: a run, scattered cells, all rows.
_TRANSFER_ROWS = (np.arange(3, 9), np.array([7, 1, 12, 4]), None)
_TRANSFER_SHAPES = ((16, 2, 8), (16, 1, 4), (16, 3, 2))


def _flat(b: Any, arrays: list[Any]) -> Any:
    """The arrays (backend or numpy) flattened into one backend array, for comparison."""
    host = [a if isinstance(a, np.ndarray) else b.to_numpy(a) for a in arrays]
    return b.from_numpy(np.concatenate([a.ravel() for a in host]))


def transfer_cases() -> list[Case]:
    """``set_n`` / ``get_n`` / ``copy_n`` over three tensors of different shapes."""
    n = len(_TRANSFER_SHAPES)
    total = sum(int(np.prod(s)) for s in _TRANSFER_SHAPES)
    picked = sum(
        int(np.prod(s[1:])) * (s[0] if r is None else len(r))
        for s, r in zip(_TRANSFER_SHAPES, _TRANSFER_ROWS, strict=True)
    )
    dsts = {f"dst{i}": np.zeros(s, np.float32) for i, s in enumerate(_TRANSFER_SHAPES)}

    def set_n(b: Any, a: dict[str, Any]) -> Any:
        b.set_n([a[f"dst{i}"] for i in range(n)], list(_TRANSFER_ROWS), a["srcs"])
        return _flat(b, [a[f"dst{i}"] for i in range(n)])

    def copy_n(b: Any, a: dict[str, Any]) -> Any:
        b.copy_n([a[f"dst{i}"] for i in range(n)], [a[f"src{i}"] for i in range(n)])
        return _flat(b, [a[f"dst{i}"] for i in range(n)])

    return [
        Case(
            "set_n-N3",
            "set_n",
            {"n_tensors": n},
            lambda rng: {
                **dsts,
                "srcs": [  # host arrays: a list, so the kit does not load them
                    _normal(rng, s[0] if r is None else len(r), *s[1:])
                    for s, r in zip(_TRANSFER_SHAPES, _TRANSFER_ROWS, strict=True)
                ],
            },
            set_n,
            (total,),
        ),
        Case(
            "get_n-N3",
            "get_n",
            {"n_tensors": n},
            lambda rng: {f"t{i}": _normal(rng, *s) for i, s in enumerate(_TRANSFER_SHAPES)},
            lambda b, a: _flat(b, b.get_n([a[f"t{i}"] for i in range(n)], list(_TRANSFER_ROWS))),
            (picked,),
        ),
        Case(
            "copy_n-N3",
            "copy_n",
            {"n_tensors": n},
            lambda rng: {
                **dsts,
                **{f"src{i}": _normal(rng, *s) for i, s in enumerate(_TRANSFER_SHAPES)},
            },
            copy_n,
            (total,),
        ),
    ]


def all_cases(qtypes: list[Any]) -> list[Case]:
    return [
        *matmul_cases(qtypes),
        *elementwise_cases(),
        *norm_cases(),
        *rope_cases(),
        *attention_cases(),
        *attention_rows_cases(),
        set_rows_case(),
        *transfer_cases(),
        *rope_ext_cases(),
        tanh_case(),
        *moe_ffn_cases(qtypes),
        *linear_cases(qtypes),
        *matmul_n_cases(qtypes),
        *gate_up_swiglu_cases(qtypes),
        *decoder_block_cases(qtypes),
    ]


def linear_cases(qtypes: list[Any]) -> list[Case]:
    """``linear``: matmul plus a bias row, on every weight type (BERT's dense layers)."""
    cases = []
    for qt in qtypes:
        n_in = _matmul_inputs(qt)
        cases.append(
            Case(
                f"linear-{qt.name}-T7-N48-K{n_in}",
                "linear",
                {"quant_type": qt.name},
                lambda rng, qt=qt, k=n_in: {
                    "x": _normal(rng, 7, k),
                    "w": Weight(_normal(rng, 48, k, scale=0.1), qt),
                    "bias": _normal(rng, 48),
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
                    "x": _normal(rng, 29, 64),
                    "w": Weight(_normal(rng, 96, 64, scale=0.2), f32),
                    "bias": _normal(rng, 96),
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
                "x": _normal(rng, 29, 96),
                "w": Weight(_normal(rng, 48, 96, scale=0.1), f32),
                "bias": _normal(rng, 48),
                "residual": _normal(rng, 29, 48),
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
        n_in = _matmul_inputs(qt)
        for n_tokens in (1, 7):
            cases.append(
                Case(
                    f"matmul_n-{qt.name}-T{n_tokens}-N48+16+8-K{n_in}",
                    "matmul_n",
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, k=n_in, t=n_tokens: {
                        "x": _normal(rng, t, k),
                        **{
                            f"w{i}": Weight(_normal(rng, n, k, scale=0.1), qt)
                            for i, n in enumerate((48, 16, 8))
                        },
                        "b0": _normal(rng, 48),
                        "b2": _normal(rng, 8),
                    },
                    lambda b, a: _flat(
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
        n_in = _matmul_inputs(qt)
        for n_tokens in (1, 7, 40):
            cases.append(
                Case(
                    f"gate_up_swiglu-{qt.name}-T{n_tokens}-N64-K{n_in}",
                    "gate_up_swiglu",
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, k=n_in, t=n_tokens: {
                        "x": _normal(rng, t, k),
                        "gate": Weight(_normal(rng, 64, k, scale=0.1), qt),
                        "up": Weight(_normal(rng, 64, k, scale=0.1), qt),
                    },
                    lambda b, a: b.gate_up_swiglu(a["x"], a["gate"], a["up"]),
                    (n_tokens, 64),
                )
            )
    return cases


#: ``decoder_block`` shape: width, query heads, KV heads, head size, FFN size, cache cells,
#: cells of the sequence (the decoded token is the last).
_BLOCK = (64, 4, 2, 16, 96, 12, 9)


def decoder_block_cases(qtypes: list[Any]) -> list[Case]:
    """``decoder_block`` for one decode token: Qwen2-style (Q/K/V biases, NeoX RoPE) and
    Qwen3-style (per-head Q/K RMSNorm, pairs (2j, 2j+1)); weights in F16, Q8_0, Q4_0. The
    result is the block's output and the token's cache cell (K rotated, V); a backend
    that declines the call (None) is checked on the ops it falls back to."""
    cases = []
    for qt in (q for q in qtypes if q.name in ("F16", "Q8_0", "Q4_0")):
        for style in ("qwen2", "qwen3"):
            cases.append(
                Case(
                    f"decoder_block-{style}-{qt.name}",
                    "decoder_block",
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, style=style: _block_inputs(rng, qt, style),
                    _block_call,
                    (_BLOCK[0] + 2 * _BLOCK[2] * _BLOCK[3],),
                )
            )
    return cases


def _block_inputs(rng: np.random.Generator, qt: Any, style: str) -> dict[str, Any]:
    from tessera.engine.kv_cache import KVCache

    n_embd, n_head, n_head_kv, head_dim, n_ff, n_cells, n_seq = _BLOCK
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    shapes = {"wq": q_dim, "wk": kv_dim, "wv": kv_dim, "w_gate": n_ff, "w_up": n_ff}
    args: dict[str, Any] = {
        name: Weight(_normal(rng, n, n_embd, scale=0.2), qt) for name, n in shapes.items()
    }
    args["wo"] = Weight(_normal(rng, n_embd, q_dim, scale=0.2), qt)
    args["w_down"] = Weight(_normal(rng, n_embd, n_ff, scale=0.2), qt)
    args["attn_norm"] = 1 + _normal(rng, n_embd, scale=0.1)
    args["ffn_norm"] = 1 + _normal(rng, n_embd, scale=0.1)
    if style == "qwen2":
        for name, n in (("bq", q_dim), ("bk", kv_dim), ("bv", kv_dim)):
            args[name] = _normal(rng, n, scale=0.5)
    else:
        args["q_norm"] = 1 + _normal(rng, head_dim, scale=0.1)
        args["k_norm"] = 1 + _normal(rng, head_dim, scale=0.1)
    cache = KVCache(None, [None], n_cells, 1)  # cell bookkeeping only
    cells = cache.find_slot(n_seq)
    cache.commit(cells, np.arange(n_seq), np.zeros(n_seq, dtype=int))
    k, v = _normal(rng, n_cells, n_head_kv, head_dim), _normal(rng, n_cells, n_head_kv, head_dim)
    unused = np.setdiff1d(np.arange(n_cells), cells)
    k[unused] = v[unused] = np.nan  # a block that reads a cell of no sequence fails
    positions = np.array([n_seq - 1])
    args.update(
        x=_normal(rng, 1, n_embd),
        k=k,
        v=v,
        cell=int(cells[-1]),
        positions=positions,
        rows=cache.rows(positions, np.array([0]), cache.n_kv()),
        style=style,
    )
    return args


def _block_call(b: Any, a: dict[str, Any]) -> Any:
    from tessera.contract.fusion import DecoderBlock

    _, n_head, n_head_kv, head_dim, *_ = _BLOCK
    block = DecoderBlock(
        **{n: a[n] for n in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm")},
        **{n: a[n] for n in ("w_gate", "w_up", "w_down")},
        **{n: a.get(n) for n in ("bq", "bk", "bv", "q_norm", "k_norm")},
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=head_dim,
        rms_eps=1e-6,
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        rope_neox=a["style"] == "qwen2",
        attn_scale=1.0 / np.sqrt(head_dim),
    )
    y = None
    if b.supports("decoder_block"):
        y = b.decoder_block(a["x"], block, a["k"], a["v"], a["cell"], a["rows"], a["positions"])
    if y is None:
        y = _block_by_ops(b, a["x"], block, a)
    return _flat(b, [y, *b.get_n([a["k"], a["v"]], [np.array([a["cell"]])] * 2)])


def _block_by_ops(b: Any, x: Any, blk: Any, a: dict[str, Any]) -> Any:
    """The block from core ops: the reference, and the path of a backend that declines."""
    h = b.rms_norm(x, blk.attn_norm, blk.rms_eps)
    q, k, v = b.matmul_n(h, [blk.wq, blk.wk, blk.wv], [blk.bq, blk.bk, blk.bv])
    q, k = q.reshape(1, blk.n_head, blk.head_dim), k.reshape(1, blk.n_head_kv, blk.head_dim)
    if blk.q_norm is not None:
        q, k = b.rms_norm(q, blk.q_norm, blk.rms_eps), b.rms_norm(k, blk.k_norm, blk.rms_eps)
    rope = (blk.n_rot, blk.rope_freq_base, blk.rope_neox, blk.rope_freq_scale)
    q, k = b.rope(q, a["positions"], *rope), b.rope(k, a["positions"], *rope)
    cell = np.array([a["cell"]])
    b.set_rows(a["k"], cell, k)
    b.set_rows(a["v"], cell, v.reshape(1, blk.n_head_kv, blk.head_dim))
    n_kv = int(a["rows"].rows.max()) + 1  # the cells past it hold NaN
    seen = np.isin(np.arange(n_kv), a["rows"].rows[0])[None]
    out = b.attention(q, a["k"], a["v"], n_kv, seen, blk.attn_scale)
    x = b.add(x, b.matmul(out, blk.wo))
    h = b.rms_norm(x, blk.ffn_norm, blk.rms_eps)
    gate, up = b.matmul_n(h, [blk.w_gate, blk.w_up])
    return b.add(x, b.matmul(b.swiglu(gate, up), blk.w_down))


#: ``moe_ffn`` cases: (rows, experts, experts used per row, expert FFN size).
_MOE_SHAPES = ((1, 8, 2, 64), (7, 8, 2, 64), (33, 6, 4, 32))


def _moe_inputs(rng, n_tokens, n_expert, k, n_ff, qtype, n_embd=64):
    # Each row picks k distinct experts; the last expert is never picked, so a backend
    # that computes unselected experts (or reads their weights) is still right but the
    # op's contract is exercised with a hole in the selection.
    ids = np.stack([rng.permutation(n_expert - 1)[:k] for _ in range(n_tokens)])
    weights = rng.random((n_tokens, k)).astype(np.float32) + np.float32(0.1)
    return {
        "x": _normal(rng, n_tokens, n_embd),
        "gate": Weight(_normal(rng, n_expert, n_ff, n_embd, scale=0.2), qtype),
        "up": Weight(_normal(rng, n_expert, n_ff, n_embd, scale=0.2), qtype),
        "down": Weight(_normal(rng, n_expert, n_embd, n_ff, scale=0.2), qtype),
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

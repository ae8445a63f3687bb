"""Conformance cases of ``attention`` over a dense mask (and of ``attention_softcap``, the same
with capped scores or with attention sinks), and of ``attention_rows`` (an optional op) over
the row lists of a real :class:`tessera.engine.kv_cache.KVCache`.

Cells that must not be read (past ``n_kv``, freed, of other sequences) hold NaN, so an op
that reads them fails; queries with nothing to see must give zeros."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.arrays import normal
from tessera.testing.conformance.kit import Case


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


#: The cap of ``attention_softcap`` cases: near the scores' spread, so tanh really bends them.
SOFTCAP = 1.5


def attention_cases(op: str = "attention", sinks: bool = False) -> list[Case]:
    """Cases of ``attention``, or with ``op="attention_softcap"`` the same with capped scores,
    or (``sinks``) uncapped with a sink logit per head (gpt-oss)."""
    cases = []
    n_tokens, n_cells, n_kv, n_head_kv, head_dim = 5, 16, 12, 2, 32
    shapes = [(g, head_dim) for g in (1, 2, 4)] + [(2, 16)]
    softcap = SOFTCAP if op == "attention_softcap" and not sinks else 0.0
    for kind in ("causal", "multi", "masked-row"):
        for group, dim_v in shapes:
            n_head = n_head_kv * group
            mask = _attention_mask(kind, n_tokens, n_kv)
            dv = f"-Dv{dim_v}" if dim_v != head_dim else ""
            extra = f"-cap{softcap:g}" if softcap else "-sinks" if sinks else ""
            probe = {
                "n_head": n_head,
                "n_head_kv": n_head_kv,
                "head_dim": head_dim,
                "head_dim_v": dim_v,
                "n_kv": n_kv,
                "n_tokens": n_tokens,
            }
            cases.append(
                Case(
                    f"{op}-{kind}-T{n_tokens}-Hq{n_head}-Hkv{n_head_kv}-D{head_dim}{dv}-kv{n_kv}{extra}",
                    op,
                    probe | ({"sinks": True} if sinks else {}),
                    lambda rng, h=n_head, dv=dim_v, m=mask: _attention_inputs(
                        rng, n_tokens, h, n_head_kv, head_dim, dv, n_cells, n_kv, m, sinks
                    ),
                    lambda b, a: _call_attention(b, a, n_kv, 1.0 / np.sqrt(head_dim), softcap),
                    (n_tokens, n_head * dim_v),
                    _masked_rows_zero,
                )
            )
    return cases


def _call_attention(b: Any, a: dict[str, Any], n_kv: int, scale: float, softcap: float) -> Any:
    args = (a["q"], a["k"], a["v"], n_kv, a["mask"], scale)
    if "sinks" in a:
        return b.attention_softcap(*args, softcap, sinks=a["sinks"])
    if softcap:
        return b.attention_softcap(*args, softcap)
    return b.attention(*args)


def _attention_inputs(
    rng, n_tokens, n_head, n_head_kv, head_dim, dim_v, n_cells, n_kv, mask, sinks=False
):
    k = normal(rng, n_cells, n_head_kv, head_dim)
    v = normal(rng, n_cells, n_head_kv, dim_v)
    k[n_kv:] = np.nan  # cells past n_kv must never be read
    v[n_kv:] = np.nan
    inputs = {"q": normal(rng, n_tokens, n_head, head_dim), "k": k, "v": v, "mask": mask}
    if sinks:  # of the scores' order, so the sink takes a real share of each softmax
        inputs["sinks"] = normal(rng, n_head, scale=2.0)
    return inputs


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
    k = normal(rng, n_cells, n_head_kv, head_dim)
    v = normal(rng, n_cells, n_head_kv, head_dim)
    unused = np.setdiff1d(np.arange(n_cells), kv_rows.rows[kv_rows.rows >= 0])
    k[unused] = np.nan
    v[unused] = np.nan
    q = normal(rng, len(positions), n_head, head_dim)
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

"""Conformance cases of ``kv_cache`` (an optional op): a KV cache stored as f16 or q8_0.

Each type has three cases: the rows written and read back (``set_rows``, ``get_n``) must be
exactly what :func:`tessera.engine.kv_types.stored_values` gives for the inputs as the
backend holds them, cells never written zero; ``attention`` and ``attention_rows`` over the
stored caches must agree with the reference over the same values (attention's budget)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.contract.ops import Op
from tessera.testing.conformance.arrays import flat, normal
from tessera.testing.conformance.kit import Case

#: The stored types a case is made for.
KV_CASE_TYPES = ("f16", "q8_0")
_CELLS, _HEAD_KV, _DIM, _HEAD, _TOKENS = 16, 2, 64, 4, 3
#: The cells written: scattered, then a run (decode's one cell and prefill's block).
_WRITTEN = (np.array([9, 2, 14]), np.arange(3, 9))


def _inputs(rng: np.random.Generator) -> dict[str, Any]:
    """K and V rows for each group of ``_WRITTEN`` cells (``k0``, ``v0``, ``k1`` ...), queries."""
    rows: dict[str, Any] = {"q": normal(rng, _TOKENS, _HEAD, _DIM)}
    for i, cells in enumerate(_WRITTEN):
        rows[f"k{i}"] = normal(rng, len(cells), _HEAD_KV, _DIM, scale=2.0)
        rows[f"v{i}"] = normal(rng, len(cells), _HEAD_KV, _DIM)
    return rows


def _filled(b: Any, a: dict[str, Any], kind: str) -> tuple[Any, Any]:
    """K and V caches of ``kind`` with the inputs' rows written into ``_WRITTEN`` cells."""
    shape = (_CELLS, _HEAD_KV, _DIM)
    caches = b.kv_cache(shape, kind), b.kv_cache(shape, kind)
    for i, cells in enumerate(_WRITTEN):
        b.set_rows(caches[0], cells, a[f"k{i}"])
        b.set_rows(caches[1], cells, a[f"v{i}"])
    return caches


def _cells() -> np.ndarray:
    return np.concatenate(_WRITTEN)


def _offered(kind: str, *ops: str) -> Any:
    def offered(b: Any) -> bool:
        if not b.supports(Op("kv_cache", {"type": kind}, b.dtype)):
            return False
        probe = {"n_head": _HEAD, "n_head_kv": _HEAD_KV, "head_dim": _DIM}
        return all(b.supports(Op(op, probe, b.dtype)) for op in ops)

    return offered


def _stored(b: Any, a: dict[str, Any], kind: str) -> Any:
    """What the caches hold minus what numpy stores for the inputs as the backend holds
    them (all zero on a conforming backend, the reference included)."""
    from tessera.engine.kv_types import stored_values

    got = b.get_n(list(_filled(b, a, kind)), [None, None])
    diffs = []
    for held, name in zip(got, ("k", "v"), strict=True):
        want = np.zeros((_CELLS, _HEAD_KV, _DIM), np.float32)
        for i, cells in enumerate(_WRITTEN):
            want[cells] = stored_values(b.to_numpy(a[f"{name}{i}"]), kind)
        diffs.append(held - want)
    return flat(b, diffs)


def _all_zero(got: np.ndarray, args: dict[str, Any]) -> str | None:
    return None if not np.any(got) else "the cache holds other values than kv_types stores"


def _attention(b: Any, a: dict[str, Any], kind: str) -> Any:
    k, v = _filled(b, a, kind)
    mask = np.zeros((_TOKENS, _CELLS), dtype=bool)
    mask[:, _cells()] = True
    mask[0, _WRITTEN[1]] = False  # the first query sees the scattered cells only
    return b.attention(a["q"], k, v, _CELLS, mask, 1.0 / np.sqrt(_DIM))


def _attention_rows(b: Any, a: dict[str, Any], kind: str) -> Any:
    from tessera.engine.kv_view import KVRows

    k, v = _filled(b, a, kind)
    cells = _cells()
    # one sequence of the written cells in position order, three queries after them
    rows = KVRows(
        q_rows=np.arange(_TOKENS, dtype=np.int64)[None],
        q_pos=np.full((1, _TOKENS), len(cells), dtype=np.int32),
        rows=cells.astype(np.int64)[None],
        pos=np.arange(len(cells), dtype=np.int32)[None],
        q_index=np.arange(_TOKENS, dtype=np.int64),
    )
    return b.attention_rows(a["q"], k, v, rows, 1.0 / np.sqrt(_DIM))


def kv_cache_cases() -> list[Case]:
    cases = []
    shape = f"C{_CELLS}-Hq{_HEAD}-Hkv{_HEAD_KV}-D{_DIM}"
    for kind in KV_CASE_TYPES:
        probe = {"type": kind}
        cases += [
            Case(
                f"kv_cache-{kind}-stored-{shape}",
                "kv_cache",
                probe,
                _inputs,
                lambda b, a, t=kind: _stored(b, a, t),
                (2 * _CELLS * _HEAD_KV * _DIM,),
                _all_zero,
            ),
            Case(
                f"kv_cache-{kind}-attention-T{_TOKENS}-{shape}",
                "kv_cache",
                probe,
                _inputs,
                lambda b, a, t=kind: _attention(b, a, t),
                (_TOKENS, _HEAD * _DIM),
                supported=_offered(kind),
            ),
            Case(
                f"kv_cache-{kind}-attention_rows-T{_TOKENS}-{shape}",
                "kv_cache",
                probe,
                _inputs,
                lambda b, a, t=kind: _attention_rows(b, a, t),
                (_TOKENS, _HEAD * _DIM),
                supported=_offered(kind, "attention_rows"),
            ),
        ]
    return cases

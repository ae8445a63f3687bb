"""Conformance cases of the ops that write and copy rows: ``set_rows`` and the batched
``set_n`` / ``get_n`` / ``copy_n``."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.testing.conformance.arrays import flat, normal
from tessera.testing.conformance.kit import Case


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
            "src": normal(rng, 3, 2, 8),
        },
        lambda b, a: (b.set_rows(a["dst"], a["rows"], a["src"]), a["dst"])[1],
        (16, 2, 8),
        _other_rows_kept,
    )


#: Rows per tensor of the batched-transfer cases: a run, scattered cells, all rows.
_TRANSFER_ROWS = (np.arange(3, 9), np.array([7, 1, 12, 4]), None)
_TRANSFER_SHAPES = ((16, 2, 8), (16, 1, 4), (16, 3, 2))


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
        return flat(b, [a[f"dst{i}"] for i in range(n)])

    def copy_n(b: Any, a: dict[str, Any]) -> Any:
        b.copy_n([a[f"dst{i}"] for i in range(n)], [a[f"src{i}"] for i in range(n)])
        return flat(b, [a[f"dst{i}"] for i in range(n)])

    return [
        Case(
            "set_n-N3",
            "set_n",
            {"n_tensors": n},
            lambda rng: {
                **dsts,
                "srcs": [  # host arrays: a list, so the kit does not load them
                    normal(rng, s[0] if r is None else len(r), *s[1:])
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
            lambda rng: {f"t{i}": normal(rng, *s) for i, s in enumerate(_TRANSFER_SHAPES)},
            lambda b, a: flat(b, b.get_n([a[f"t{i}"] for i in range(n)], list(_TRANSFER_ROWS))),
            (picked,),
        ),
        Case(
            "copy_n-N3",
            "copy_n",
            {"n_tensors": n},
            lambda rng: {
                **dsts,
                **{f"src{i}": normal(rng, *s) for i, s in enumerate(_TRANSFER_SHAPES)},
            },
            copy_n,
            (total,),
        ),
    ]

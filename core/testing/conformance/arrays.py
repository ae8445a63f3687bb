"""Helpers the case modules share: standard-normal float32 inputs, the matmul-like cases'
input width, and outputs flattened into one array for comparison."""

from __future__ import annotations

from typing import Any

import numpy as np


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def matmul_width(qt: Any) -> int:
    """Input width of the matmul-like cases: 256, or 4 blocks of a type whose block does
    not divide 256."""
    return 256 if 256 % qt.block_size == 0 else 4 * qt.block_size


def flat(b: Any, arrays: list[Any]) -> Any:
    """The arrays (backend or numpy) flattened into one backend array, for comparison."""
    host = [a if isinstance(a, np.ndarray) else b.to_numpy(a) for a in arrays]
    return b.from_numpy(np.concatenate([a.ravel() for a in host]))

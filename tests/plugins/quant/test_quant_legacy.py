"""Q4_1, Q5_0, Q5_1 quantize and dequantize bit for bit as gguf.quants (which implements
ggml's reference quantizers for these types), on edge rows and on arbitrary floats."""

from __future__ import annotations

import warnings

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tessera.plugin_manager import Runtime

NAMES = ["Q4_1", "Q5_0", "Q5_1"]
RUNTIME = Runtime()


def assert_matches_gguf(values: np.ndarray, name: str) -> None:
    qt = RUNTIME.quant_type_by_name(name)
    kind = GGMLQuantizationType[name]
    with warnings.catch_warnings():  # float16 overflow of huge blocks: gguf warns the same
        warnings.simplefilter("ignore", RuntimeWarning)
        ours = qt.quantize(values)
        theirs = np.ascontiguousarray(gguf.quants.quantize(values, kind)).view(np.uint8)
        assert ours.dtype == np.uint8 and ours.shape == theirs.shape
        differ = (ours.reshape(-1, qt.type_size) != theirs.reshape(-1, qt.type_size)).any(1)
        assert not differ.any(), f"{differ.sum()} blocks differ, first {np.flatnonzero(differ)[:5]}"
        decoded = qt.dequantize(ours)
        reference = gguf.quants.dequantize(theirs, kind).astype(np.float32)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded.view(np.uint32), reference.view(np.uint32))


def edge_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((14, 256)).astype(np.float32)
    rows[0] = 0.0  # scale 0: no division
    rows[1, :64] = 0.0  # zero blocks next to others
    rows[2] *= np.float32(1e30)  # beyond float16: d and m overflow to infinities
    rows[3] *= np.float32(1e-30)  # d underflows to 0 in float16, not in float32
    rows[4] *= np.float32(1e-39)  # float32 subnormals
    rows[5] = np.round(rows[5] * 4) / 4  # exact ties for the rounding
    rows[6, ::32] = 16.0  # Q5_0: largest magnitude 16, d = -1, codes x + 16.5 exactly
    rows[7, 0::32], rows[7, 1::32] = -3.0, 3.0  # equal magnitudes, negative first
    rows[8, 0::32], rows[8, 1::32] = 3.0, -3.0  # ... positive first
    rows[9] *= np.float32(65504.0)  # max - min beyond float16's range
    rows[10] = np.abs(rows[10])  # all positive: min > 0
    rows[11] = -np.abs(rows[11])  # all negative
    rows[12] = 0.3  # constant blocks: d = 0 for Q4_1 / Q5_1
    rows[13] = np.arange(256) % 32 - 15.5  # every code of a 5-bit range on a grid
    return rows


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_edge_rows_match_gguf_bit_for_bit(name, seed):
    assert_matches_gguf(edge_rows(seed), name)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(
    values=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.sampled_from([32, 64, 96])),
        elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=True),
    )
)
def test_any_finite_floats_match_gguf_bit_for_bit(name, values):
    assert_matches_gguf(values, name)

"""Quant type plugins F32/F16/BF16/Q8_0/Q4_0: bit-exact with gguf.quants, both directions."""

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

NAMES = ["F32", "F16", "BF16", "Q8_0", "Q4_0"]
RUNTIME = Runtime()


def qtype(name):
    return RUNTIME.quant_type_by_name(name)


def gguf_bytes(values: np.ndarray, name: str) -> np.ndarray:
    out = gguf.quants.quantize(values, GGMLQuantizationType[name])
    return np.ascontiguousarray(out).view(np.uint8).reshape(values.shape[0], -1)


def assert_matches_gguf(values: np.ndarray, name: str) -> None:
    qt = qtype(name)
    with warnings.catch_warnings():  # f16 overflow of huge blocks: gguf warns the same way
        warnings.simplefilter("ignore", RuntimeWarning)
        ours = qt.quantize(values)
        theirs = gguf_bytes(values, name)
        assert ours.dtype == np.uint8 and ours.shape == theirs.shape
        assert ours.tobytes() == theirs.tobytes()
        decoded = qt.dequantize(ours)
        reference = gguf.quants.dequantize(theirs, GGMLQuantizationType[name])
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, reference)


def sample_rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((12, 256)).astype(np.float32)
    rows[0] = 0.0  # an all-zero row: scale 0, no division
    rows[1, :64] = 0.0  # zero blocks next to non-zero ones
    rows[2] *= np.float32(1e30)  # beyond float16: the scale overflows to inf, as in ggml
    rows[3] *= np.float32(1e-30)  # tiny magnitudes
    rows[4] *= np.float32(1e-39)  # subnormal floats
    rows[5] = np.round(rows[5] * 4) / 4  # exact ties for the rounding rules
    rows[6, ::32] = 8.0  # block maxima that are exact multiples
    rows[7, 0::32], rows[7, 1::32] = -3.0, 3.0  # equal magnitudes of both signs
    rows[8] *= np.float32(65504.0)
    return rows


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_and_dequantize_match_gguf_bit_for_bit(name, seed):
    assert_matches_gguf(sample_rows(seed), name)


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_types_keep_special_values_like_gguf(name):
    nan_payload = np.array([0x7FA00001, 0xFFC00000, 0x7F800001], dtype=np.uint32).view(np.float32)
    special = np.array([np.inf, -np.inf, -0.0, 3.4e38, 1e-45, 1.0000001, 65519.0], np.float32)
    assert_matches_gguf(np.concatenate([nan_payload, special])[None, :], name)


def test_bf16_rounds_to_nearest_even():
    # 1 + 2**-8 lies halfway between two bf16 values; the even one is 1.0.
    values = np.array([[1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20]], np.float32)
    decoded = qtype("BF16").dequantize(qtype("BF16").quantize(values))
    np.testing.assert_array_equal(decoded, [[1.0, 1 + 2**-6, 1 + 2**-7]])


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_tensor_helpers_round_trip_shapes(name):
    qt = qtype(name)
    values = sample_rows(3)[9:].reshape(3, 2, 128)
    data = qt.quantize_tensor(values)
    assert data.shape == (3 * 2 * qt.row_bytes(128),)
    assert qt.dequantize_tensor(data, values.shape).shape == values.shape


finite = st.floats(width=32, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    values=hnp.arrays(
        np.float32, st.tuples(st.integers(1, 3), st.sampled_from([32, 64])), elements=finite
    ),
    magnitude=st.sampled_from([1.0, 1e-20, 1e20]),
)
def test_any_finite_values_match_gguf(name, values, magnitude):
    with np.errstate(over="ignore", under="ignore"):
        scaled = (values * np.float32(magnitude)).astype(np.float32)
    assert_matches_gguf(scaled, name)


def test_registered_with_ggml_type_ids_and_layouts():
    expected = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18)}
    for name, (block, size) in expected.items():
        qt = qtype(name)
        assert qt.ggml_type == int(GGMLQuantizationType[name])
        assert (qt.block_size, qt.type_size) == (block, size)
        assert RUNTIME.quant_type(qt.ggml_type) is qt

"""The float32 helpers the K-quant quantizers rest on, against scalar oracles written the
way the C code computes: ggml's ``nearest_int`` bit trick, and in-order sums."""

from __future__ import annotations

import struct

import numpy as np

from tessera.plugins.quant.kquant_common import column_sum, nearest_int


def c_nearest_int(value: float) -> int:
    """ggml's ``nearest_int``, one value: float32 add, reinterpret the bits as int32."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.float32(value) + np.float32(12582912.0)
    (bits,) = struct.unpack("<i", struct.pack("<f", shifted))
    return (bits & 0x007FFFFF) - 0x00400000


def test_nearest_int_reproduces_ggml_for_any_float():
    rng = np.random.default_rng(0)
    values = np.concatenate(
        [
            rng.uniform(-40, 40, 2000),
            np.arange(-20, 20) + 0.5,  # ties: to even
            [4194303.0, -4194303.0, 4194304.5, 6e6, -1e9, 3e38, np.inf, -np.inf, np.nan],
            [0.0, -0.0, 1e-45, 0.49999997, -0.49999997],
        ]
    ).astype(np.float32)
    got = nearest_int(values)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [c_nearest_int(v) for v in values])
    in_range = np.abs(values) <= 4194303
    np.testing.assert_array_equal(got[in_range], np.rint(values[in_range]))


def test_column_sum_adds_rows_in_order():
    rng = np.random.default_rng(1)
    # terms of very different magnitudes, so that the order of the additions shows
    values = (rng.standard_normal((32, 500)) * 10.0 ** rng.integers(-6, 6, (32, 500))).astype(
        np.float32
    )
    want = np.empty(values.shape[1], np.float32)
    for j in range(values.shape[1]):
        total = np.float32(values[0, j])
        for k in range(1, values.shape[0]):
            total = np.float32(total + values[k, j])
        want[j] = total
    np.testing.assert_array_equal(column_sum(values), want)
    assert not np.array_equal(np.sum(values[::-1], axis=0), want)  # another order differs

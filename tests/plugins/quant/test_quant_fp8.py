"""FP8_E4M3: the OCP E4M3 encoding with saturating conversion, checked value by value and
against torch's ``float8_e4m3fn`` (clamped first, since torch's cast does not saturate)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime
from tessera.plugins.quant.fp8_e4m3 import GGML_TYPE_FP8_E4M3, quantize_torch

RUNTIME = Runtime()
FP8 = RUNTIME.quant_type_by_name("FP8_E4M3")


def encode(values) -> list[int]:
    return FP8.quantize(np.array(values, dtype=np.float32)).tolist()


def test_registered_as_one_byte_per_value():
    assert (FP8.block_size, FP8.type_size) == (1, 1)
    assert RUNTIME.quant_type(GGML_TYPE_FP8_E4M3) is FP8


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (448.0, 0x7E),
        (-448.0, 0xFE),
        (449.0, 0x7E),  # beyond the largest finite value: saturates
        (-449.0, 0xFE),
        (464.0, 0x7E),  # halfway to 480 (not representable): still 448
        (1e9, 0x7E),
        (-1e9, 0xFE),
        (3.4e38, 0x7E),
        (np.inf, 0x7E),
        (-np.inf, 0xFE),
        (0.0, 0x00),
        (-0.0, 0x80),
        (1.0, 0x38),  # exponent 7 (bias 7), mantissa 0
        (-2.0, 0xC0),
        (1.0625, 0x38),  # halfway between 1 and 1.125: ties to even
        (1.1875, 0x3A),  # halfway between 1.125 and 1.25: ties to even (1.25)
        (2.0**-6, 0x08),  # smallest normal
        (2.0**-9, 0x01),  # smallest subnormal
        (7 * 2.0**-9, 0x07),  # largest subnormal
        (2.0**-10, 0x00),  # half the smallest subnormal: ties to even (0)
        (3 * 2.0**-10, 0x02),  # 1.5 quanta: ties to even (2)
        (-5 * 2.0**-9, 0x85),
        (1e-30, 0x00),
        (15.5 * 2.0**-10, 0x08),  # 7.75 quanta rounds up into the smallest normal
    ],
)
def test_encodes_like_ocp_e4m3_saturating(value, code):
    assert encode([value]) == [code]


def test_nan_stays_nan_with_its_sign():
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001], dtype=np.uint32).view(np.float32)
    assert encode(nans) == [0x7F, 0xFF, 0x7F]
    assert np.isnan(FP8.dequantize(np.array([0x7F, 0xFF], np.uint8))).all()


def test_all_256_codes_round_trip():
    codes = np.arange(256, dtype=np.uint8)
    values = FP8.dequantize(codes)
    assert np.isnan(values).sum() == 2
    np.testing.assert_array_equal(FP8.quantize(values), codes)
    assert values[0x7E] == 448 and values[0x01] == 2.0**-9 and values[0x80] == 0
    assert np.signbit(values[0x80])


def test_decode_matches_torch_float8_e4m3fn():
    codes = np.arange(256, dtype=np.uint8)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(FP8.dequantize(codes), theirs)


def test_encode_matches_clamped_torch_cast_bit_for_bit():
    rng = np.random.default_rng(0)
    # a spread of float32 bit patterns: every exponent, random mantissas, both signs
    bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32)
    values = np.concatenate(
        [
            bits.view(np.float32),
            rng.standard_normal(100_000).astype(np.float32) * np.float32(0.02),
            (np.arange(-4096, 4096) * np.float32(2.0**-12)).astype(np.float32),
        ]
    )
    ours = FP8.quantize(values)
    theirs = quantize_torch(torch.from_numpy(values)).view(torch.uint8).numpy()
    nan = np.isnan(values)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    assert ((ours[nan] & 0x7F) == 0x7F).all()


def test_torch_kernel_multiplies_like_dequantize():
    backend = RUNTIME.create_backend("torch", "cpu", "f32")
    kernel = RUNTIME.weight_kernels()[("torch", "FP8_E4M3")]
    assert not kernel.supports(backend)  # on the CPU the dense fallback is faster
    w = np.random.default_rng(2).standard_normal((24, 64)).astype(np.float32)
    raw = RawTensor("w", GGML_TYPE_FP8_E4M3, w.shape, FP8.quantize_tensor(w))
    dense = FP8.dequantize_tensor(raw.data, w.shape)
    weight = kernel.load(backend, raw)
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    got = backend.to_numpy(weight.matmul(backend.from_numpy(x)))
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-4)
    rows_got = backend.to_numpy(weight.get_rows(np.array([5, 1])))
    np.testing.assert_array_equal(rows_got, dense[[5, 1]])

"""MXFP4 and NVFP4: quantize bit for bit as llama-quantize (and, for MXFP4, gguf.quants),
dequantize bit for bit as gguf.quants, for every scale byte."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from llama_quantize_vectors import (
    assert_bits_equal,
    assert_blocks_equal,
    assert_quantizes_as_llama_quantize,
    assert_vectors_dequantize_as_gguf,
    gguf_dequantize,
    random_blocks,
)

from tessera.plugin_manager import Runtime
from tessera.plugins.quant.fp4 import fp32_to_ue4m3, mxfp4_exponent
from tessera.testing.pytest_plugin import quant_type_conformance

RUNTIME = Runtime()
NAMES = ["MXFP4", "NVFP4"]
#: (vector prefix, type) -> tensors stored in the type. NVFP4's 64-blocks do not fit the
#: edge source's rows of 32 (attn_output, ffn_down: Q8_0 there).
COUNTS = {
    ("llama-quantize-pure-", "MXFP4"): 9,
    ("llama-quantize-pure-edge-", "MXFP4"): 9,
    ("llama-quantize-pure-edge-huge-", "MXFP4"): 9,
    ("llama-quantize-pure-", "NVFP4"): 9,
    ("llama-quantize-pure-edge-", "NVFP4"): 7,
}


@pytest.mark.parametrize(("prefix", "name"), list(COUNTS))
def test_quantize_reproduces_llama_quantize_bytes(prefix, name):
    assert_quantizes_as_llama_quantize(
        RUNTIME.quant_type_by_name(name), prefix, COUNTS[(prefix, name)]
    )


def near_powers_of_two() -> np.ndarray:
    """Blocks whose largest magnitude is a power of two or 1-2 ulps around one, where
    ``floor(log2f(amax))`` depends on log2f's rounding."""
    p = np.float32(2.0) ** np.arange(-40, 40, dtype=np.float32)
    peaks = np.concatenate(
        [p, np.nextafter(p, 0), np.nextafter(np.nextafter(p, 0), 0), np.nextafter(p, np.inf)]
    ).astype(np.float32)
    rng = np.random.default_rng(2)
    blocks = peaks[:, None] * rng.uniform(-1, 1, (len(peaks), 32)).astype(np.float32)
    blocks[:, 7] = peaks * np.where(np.arange(len(peaks)) % 2, -1, 1)
    return blocks.astype(np.float32)


def test_mxfp4_quantize_matches_gguf_quants():
    qt = RUNTIME.quant_type_by_name("MXFP4")
    rng = np.random.default_rng(4)
    rows = rng.standard_normal((16, 256)).astype(np.float32) * np.float32(0.05)
    rows[0] = 0.0
    rows[1] *= np.float32(1e4)
    for x in (rows, near_powers_of_two()):
        theirs = gguf.quants.quantize(x, GGMLQuantizationType.MXFP4)
        assert_blocks_equal(qt.quantize(x), theirs, qt.type_size, "MXFP4")


def test_mxfp4_exponent_rounds_log2_as_log2f():
    # One ulp below 2**k, log2 is k - 8.6e-8: within half a float32 ulp of k when k >= 3
    # or k <= -2, so log2f returns k and the exponent is k - 2 + 127; else it is one less.
    k = np.arange(-6, 7)
    below = np.nextafter(np.float32(2.0) ** k.astype(np.float32), 0)
    want = np.where((k >= 3) | (k <= -2), k, k - 1) + 125
    assert mxfp4_exponent(below).tolist() == want.tolist()
    assert mxfp4_exponent(np.float32([0.0, 1.0, 6.0, 0.25])).tolist() == [0, 125, 127, 123]


def test_ue4m3_rounding_matches_ggml():
    # Every UE4M3 value, the midpoints between neighbours and one float32 ulp around each,
    # beyond 448, subnormal and non-positive inputs; the oracle is gguf's transcription
    # of ggml_fp32_to_ue4m3.
    table = gguf.quants.NVFP4.ue4m3_to_fp32(np.arange(0x7F, dtype=np.uint8)) * 2
    values = np.unique(table.astype(np.float32))
    mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    x = np.concatenate([values, mids, [500.0, 1e30, np.inf, -1.0, 0.0, 2e-3, 1e-40]])
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([x, np.nextafter(x, 0), np.nextafter(x, np.inf)]).astype(np.float32)
        np.testing.assert_array_equal(fp32_to_ue4m3(x), gguf.quants.NVFP4.fp32_to_ue4m3(x))
    assert fp32_to_ue4m3(np.float32([np.nan, 448.0, 1e9])).tolist() == [0, 0x7E, 0x7E]


def test_mxfp4_dequantizes_every_exponent_like_gguf():
    qt = RUNTIME.quant_type_by_name("MXFP4")
    blocks = random_blocks("MXFP4", 256, seed=6, scale_at=None)
    blocks[:, 0] = np.arange(256)  # every E8M0 byte, subnormal 2**-128 to 2**127
    assert_bits_equal(qt.dequantize(blocks), gguf_dequantize(blocks, "MXFP4"))
    assert_bits_equal(
        qt.dequantize(blocks.reshape(8, -1)), gguf_dequantize(blocks.reshape(8, -1), "MXFP4")
    )


def test_nvfp4_dequantizes_every_scale_like_gguf():
    qt = RUNTIME.quant_type_by_name("NVFP4")
    blocks = random_blocks("NVFP4", 64, seed=7, scale_at=None)
    blocks[:, :4] = np.arange(256).reshape(64, 4)  # every UE4M3 byte, 0x7F and 0x80+ too
    assert_bits_equal(qt.dequantize(blocks), gguf_dequantize(blocks, "NVFP4"))


@pytest.mark.parametrize("name", NAMES)
def test_vectors_dequantize_like_gguf(name):
    qt = RUNTIME.quant_type_by_name(name)
    assert_vectors_dequantize_as_gguf(qt)


def test_registered_with_ggml_ids_and_layouts():
    for name in NAMES:
        qt = RUNTIME.quant_type_by_name(name)
        assert qt.ggml_type == int(GGMLQuantizationType[name]) and not qt.read_only
        assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert RUNTIME.quant_type(qt.ggml_type) is qt


test_mxfp4_conformance = quant_type_conformance(
    "MXFP4",
    reference_quantize=lambda x: gguf.quants.quantize(x, GGMLQuantizationType.MXFP4),
    reference_dequantize=lambda b: gguf_dequantize(b, "MXFP4"),
)
# gguf.quants decodes NVFP4 but cannot write it. Its UE4M3 scales (no per-tensor scale in
# ggml) reach down to 2**-10: a block whose max|x| is below ~0.006 quantizes to zeros, so
# the round trip is measured from the kit's second row scale (0.046) up.
test_nvfp4_conformance = quant_type_conformance(
    "NVFP4",
    reference_dequantize=lambda b: gguf_dequantize(b, "NVFP4"),
    row_scales=(4.6e-2, 2.2, 1e2),
)

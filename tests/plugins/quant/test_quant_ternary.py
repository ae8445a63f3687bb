"""TQ1_0 and TQ2_0: quantize bit for bit as llama-quantize and gguf.quants, dequantize bit
for bit as gguf.quants."""

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
from tessera.testing.pytest_plugin import quant_type_conformance

RUNTIME = Runtime()
NAMES = ["TQ1_0", "TQ2_0"]
#: Where the float16 scale sits: after the trits.
SCALE_AT = {"TQ1_0": 52, "TQ2_0": 64}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("prefix", "count"), [("llama-quantize-pure-", 9), ("llama-quantize-pure-edge-", 7)]
)
def test_quantize_reproduces_llama_quantize_bytes(name, prefix, count):
    # The edge source's rows of 32 (attn_output, ffn_down) fall back to Q4_0 there.
    assert_quantizes_as_llama_quantize(RUNTIME.quant_type_by_name(name), prefix, count)


def sample_rows() -> np.ndarray:
    rng = np.random.default_rng(11)
    rows = rng.standard_normal((8, 512)).astype(np.float32)
    rows[0] = 0.0
    rows[1, :256] = np.float32(1e-20)
    rows[2] = rng.integers(-1, 2, 512) * np.float32(0.75)  # exactly ternary
    rows[3] = np.tile(np.float32([1.0, 0.5, -0.5, 0.49999997, -0.50000006, 0.0]), 86)[:512]
    rows[4] *= np.float32(6e4)
    return rows


@pytest.mark.parametrize("name", NAMES)
def test_quantize_matches_gguf_quants(name):
    qt = RUNTIME.quant_type_by_name(name)
    rows = sample_rows()
    with np.errstate(over="ignore"):  # 6e4 * 3 overflows float16, in gguf as in ggml
        theirs = gguf.quants.quantize(rows, GGMLQuantizationType[name])
    assert_blocks_equal(qt.quantize(rows), theirs, qt.type_size, name)
    # Ties round away from zero: 0.5 of the block maximum is a +-1 trit.
    back = qt.dequantize(qt.quantize(rows[3:4]))
    np.testing.assert_array_equal(back[0, :6], [1.0, 1.0, -1.0, 0.0, -1.0, 0.0])


@pytest.mark.parametrize("name", NAMES)
def test_subnormal_block_maximum_gives_zero_trits_as_llama_cpp(name):
    # 1/d overflows to inf: ggml's lroundf of +-inf (and NaN) lands on the trit of 0.
    qt = RUNTIME.quant_type_by_name(name)
    x = np.full((1, 256), np.float32(1e-40))
    x[0, ::2] *= -1
    data = qt.quantize(x)
    np.testing.assert_array_equal(qt.dequantize(data), 0.0)
    assert data[0, -2:].tolist() == [0, 0]  # d rounds to float16 zero
    # Trits all 1: 11111 in base 3 (121) as ceil(121 * 256 / 243); 01010101 in bits.
    assert data[0, 0] == {"TQ1_0": 128, "TQ2_0": 0x55}[name]


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_gguf_bit_for_bit(name):
    qt = RUNTIME.quant_type_by_name(name)
    assert_vectors_dequantize_as_gguf(qt)
    # Every byte value (also those no quantizer writes) with special float16 scales.
    blocks = random_blocks(name, 256, seed=5, scale_at=SCALE_AT[name])
    blocks[:, 0] = np.arange(256)
    assert_bits_equal(qt.dequantize(blocks), gguf_dequantize(blocks, name))


def test_registered_with_ggml_ids_and_layouts():
    for name in NAMES:
        qt = RUNTIME.quant_type_by_name(name)
        assert qt.ggml_type == int(GGMLQuantizationType[name]) and not qt.read_only
        assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert RUNTIME.quant_type(qt.ggml_type) is qt


def _gguf(name):
    return {
        "reference_quantize": lambda x: gguf.quants.quantize(x, GGMLQuantizationType[name]),
        "reference_dequantize": lambda b: gguf_dequantize(b, name),
        # With d = max|x| of 256 normal values (~3 sigma), values below 1.5 sigma become 0:
        # the round trip's relative RMS error is ~0.82 (all zeros: 1; a shuffled layout ~1.5).
        "max_error": 0.9,
    }


test_tq1_0_conformance = quant_type_conformance("TQ1_0", **_gguf("TQ1_0"))
test_tq2_0_conformance = quant_type_conformance("TQ2_0", **_gguf("TQ2_0"))

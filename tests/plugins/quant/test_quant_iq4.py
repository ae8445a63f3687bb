"""IQ4_NL and IQ4_XS: quantize bit for bit as llama-quantize (its scale search included),
dequantize bit for bit as gguf.quants.

``gguf.quants`` cannot write IQ4 types, so the quantize oracle is tests/data/quants: every
2-D tensor of two small models quantized by llama.cpp's own ``llama-quantize --pure``.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from llama_quantize_vectors import (
    assert_bits_equal,
    assert_quantizes_as_llama_quantize,
    assert_vectors_dequantize_as_gguf,
    gguf_dequantize,
    random_blocks,
)

from tessera.plugin_manager import Runtime
from tessera.plugins.quant.iq4 import VALUES, best_index
from tessera.testing.pytest_plugin import quant_type_conformance

RUNTIME = Runtime()
NAMES = ["IQ4_NL", "IQ4_XS"]
#: Vector -> tensors stored in the type: 9 in the main source; in the edge one IQ4_XS's
#: rows of 32 (attn_output, ffn_down) fall back to IQ4_NL.
COUNTS = {
    ("llama-quantize-pure-", "IQ4_NL"): 9,
    ("llama-quantize-pure-", "IQ4_XS"): 9,
    ("llama-quantize-pure-edge-", "IQ4_NL"): 9,
    ("llama-quantize-pure-edge-", "IQ4_XS"): 7,
}


@pytest.mark.parametrize(("prefix", "name"), list(COUNTS))
def test_quantize_reproduces_llama_quantize_bytes(prefix, name):
    assert_quantizes_as_llama_quantize(
        RUNTIME.quant_type_by_name(name), prefix, COUNTS[(prefix, name)]
    )


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_gguf_bit_for_bit(name):
    qt = RUNTIME.quant_type_by_name(name)
    assert_vectors_dequantize_as_gguf(qt)
    # Every code and (IQ4_XS) every 6-bit group scale, with zero, largest, subnormal,
    # infinite and NaN float16 scales.
    blocks = random_blocks(name, 512, seed=3, scale_at=0)
    assert_bits_equal(qt.dequantize(blocks), gguf_dequantize(blocks, name))
    assert_bits_equal(
        qt.dequantize(blocks.reshape(4, -1)), gguf_dequantize(blocks.reshape(4, -1), name)
    )


def c_best_index(x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8`` spelled out: binary search, then ``x - lo < hi - x``."""
    upper = np.clip(np.searchsorted(VALUES, x, side="right"), 1, 15)
    index = np.where(x - VALUES[upper - 1] < VALUES[upper] - x, upper - 1, upper)
    return np.where(x <= VALUES[0], 0, np.where(x >= VALUES[-1], 15, index))


def test_best_index_table_is_ggml_comparison():
    # Every float32 within 2**16 ulps of each midpoint, each table value and zero (where
    # ggml's rounded differences could disagree with the exact midpoint), plus specials.
    centres = np.concatenate([(VALUES[:-1] + VALUES[1:]) / 2, VALUES, [0.0]]).astype(np.float32)
    for centre in centres:
        bits = int(centre.view(np.int32)) + np.arange(-(2**16), 2**16)
        x = bits[(bits >= 0) | (centre < 0)].astype(np.int32).view(np.float32)
        x = x[np.isfinite(x)]
        np.testing.assert_array_equal(best_index(x), c_best_index(x))
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e38, -3e38], np.float32)
    np.testing.assert_array_equal(best_index(special), [15, 15, 15, 0, 8, 8, 15, 0])


def test_zero_and_tiny_groups_store_a_zero_scale():
    x = np.zeros((2, 256), np.float32)
    x[1, :32] = 1e-16  # below ggml's GROUP_MAX_EPS: counts as zero
    x[1, 32:] = np.linspace(-1, 1, 224, dtype=np.float32)
    nl = RUNTIME.quant_type_by_name("IQ4_NL").quantize(x).reshape(-1, 18)
    np.testing.assert_array_equal(nl[[0, 8]], [[0, 0] + [0x88] * 16] * 2)  # code 8: table 1
    xs = RUNTIME.quant_type_by_name("IQ4_XS").quantize(x[:1])
    assert xs[0, :2].tolist() == [0x00, 0x80]  # d = -0/32, as ggml stores it
    assert (RUNTIME.quant_type_by_name("IQ4_XS").dequantize(xs) == 0).all()


def test_registered_with_ggml_ids_and_layouts():
    for name in NAMES:
        qt = RUNTIME.quant_type_by_name(name)
        assert qt.ggml_type == int(GGMLQuantizationType[name]) and not qt.read_only
        assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert RUNTIME.quant_type(qt.ggml_type) is qt


test_iq4_nl_conformance = quant_type_conformance(
    "IQ4_NL", reference_dequantize=lambda b: gguf_dequantize(b, "IQ4_NL")
)
test_iq4_xs_conformance = quant_type_conformance(
    "IQ4_XS", reference_dequantize=lambda b: gguf_dequantize(b, "IQ4_XS")
)

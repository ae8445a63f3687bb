"""The grid types IQ1_S ... IQ3_S: dequantize bit for bit as gguf.quants; quantize refused
with a message that says why and what to use instead; files holding them still convert."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from llama_quantize_vectors import SPECIAL_F16, assert_bits_equal, gguf_dequantize, random_blocks

from tessera.errors import TesseraError
from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.plugin_manager import Runtime
from tessera.plugins.quant.iq_grid import KSIGNS, grid_from_gguf
from tessera.testing.pytest_plugin import quant_type_conformance

RUNTIME = Runtime()
NAMES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]
#: Byte offset of the float16 super-block scale (IQ1_M spreads its own over 4 nibbles).
SCALE_AT = {name: 0 for name in NAMES} | {"IQ1_M": None}


def stored_blocks(name: str, n_blocks: int = 2048, seed: int = 8) -> np.ndarray:
    """Random blocks with special float16 scales first. 2048 blocks draw each grid index
    at least 64 times on average (IQ1_S: 2048 points, 32 runs a block), so every point is
    reached (a given one is missed with probability below e**-32)."""
    blocks = random_blocks(name, n_blocks, seed, SCALE_AT[name])
    if name == "IQ1_M":  # d's 16 bits are the top nibbles of the 4 uint16 scales
        sc = blocks[:, 48:56].copy().view("<u2")
        d = np.resize(SPECIAL_F16, n_blocks)[:, None]
        nibbles = (d >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 15
        sc = (sc & 0x0FFF) | nibbles << 12
        blocks[:, 48:56] = sc.astype("<u2").view(np.uint8)
    return blocks


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_gguf_bit_for_bit(name):
    qt = RUNTIME.quant_type_by_name(name)
    blocks = stored_blocks(name)
    ours = qt.dequantize(blocks)
    assert_bits_equal(ours, gguf_dequantize(blocks, name))
    assert np.isnan(ours).any() and np.isinf(ours).any() and (ours == 0).any()
    rows = blocks[:64].reshape(8, -1)  # several blocks a row
    assert_bits_equal(qt.dequantize(rows), gguf_dequantize(rows, name))


def test_iq1_m_scale_nibbles_assemble_the_float16():
    qt = RUNTIME.quant_type_by_name("IQ1_M")
    blocks = stored_blocks("IQ1_M", n_blocks=len(SPECIAL_F16))
    blocks[:, :48] = 0  # grid point 0 (all -1), delta +1/8, group scales 1
    blocks[:, 48:56:2] = 0  # scale words: low bytes, then the low nibble of the high ones
    blocks[:, 49:56:2] &= 0xF0
    d = SPECIAL_F16.view("<f2").astype(np.float32)
    with np.errstate(invalid="ignore"):
        want = d[:, None] * np.float32(-0.875) * np.ones((1, 256), np.float32)
    assert_bits_equal(qt.dequantize(blocks), want)


def test_grids_decode_gguf_tables():
    # Shapes and levels of the format's tables, and ksigns' parity bit (even sign count).
    expect = {
        "IQ2_XXS": ((256, 8), {8, 25, 43}),
        "IQ2_XS": ((512, 8), {8, 25, 43}),
        "IQ2_S": ((1024, 8), {8, 25, 43}),
        "IQ3_XXS": ((256, 4), set(range(4, 60, 8)) | {62}),
        "IQ3_S": ((512, 4), set(range(1, 16, 2))),
        "IQ1_S": ((2048, 8), {-1, 0, 1}),
    }
    for name, (shape, levels) in expect.items():
        grid = grid_from_gguf(name)
        assert grid.shape == shape and set(np.unique(grid).tolist()) == levels
        assert len(np.unique(grid, axis=0)) == shape[0]  # distinct points
    bits = np.unpackbits(KSIGNS[:, None], axis=1)
    assert (bits.sum(axis=1) % 2 == 0).all() and (KSIGNS & 127).tolist() == list(range(128))


@pytest.mark.parametrize("name", NAMES)
def test_quantize_refuses_with_the_way_out(name):
    qt = RUNTIME.quant_type_by_name(name)
    assert qt.read_only
    assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]]
    assert RUNTIME.quant_type(qt.ggml_type) is qt
    with pytest.raises(TesseraError, match=f"{name}.*importance matrix.*IQ4_XS"):
        qt.quantize(np.ones((1, 256), np.float32))


def test_a_model_in_a_grid_type_requantizes_to_q8_0(tmp_path):
    from tessera.plugins.cmd.quantize import quantize_model

    stored = stored_blocks("IQ2_XS", n_blocks=8)
    stored[:, :2] = np.array([0.01], "<f2").view(np.uint8)  # finite scales
    raw = RawTensor(
        "blk.0.attn_q.weight", int(GGMLQuantizationType.IQ2_XS), (4, 512), stored.reshape(-1)
    )
    src = write_gguf(tmp_path / "in.gguf", {"general.architecture": "llama"}, [raw])
    quantize_model(src, tmp_path / "out.gguf", "q8_0", RUNTIME, pure=True)
    out = read_gguf(tmp_path / "out.gguf").tensors["blk.0.attn_q.weight"]
    q8 = RUNTIME.quant_type_by_name("Q8_0")
    values = RUNTIME.quant_type_by_name("IQ2_XS").dequantize(stored.reshape(4, -1))
    assert out.ggml_type == q8.ggml_type
    assert np.array_equal(np.asarray(out.data), q8.quantize_tensor(values))


def _conformance(name):
    return quant_type_conformance(
        name,
        reference_dequantize=lambda b: gguf_dequantize(b, name),
        sample_bytes=stored_blocks(name, n_blocks=32).reshape(4, -1),
    )


test_iq1_s_conformance = _conformance("IQ1_S")
test_iq1_m_conformance = _conformance("IQ1_M")
test_iq2_xxs_conformance = _conformance("IQ2_XXS")
test_iq2_xs_conformance = _conformance("IQ2_XS")
test_iq2_s_conformance = _conformance("IQ2_S")
test_iq3_xxs_conformance = _conformance("IQ3_XXS")
test_iq3_s_conformance = _conformance("IQ3_S")

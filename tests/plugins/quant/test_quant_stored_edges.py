"""Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K decode any stored block bit for bit as gguf.quants,
and pass the quant-type conformance kit.

The blocks are made, not quantized: every float16 scale field takes each special value
(zero of both signs, the largest and smallest normals, subnormals, infinities, NaNs) and
the other bytes are random, so every code and every packed group scale occurs. Compared
as float32 bit patterns, NaN payloads and signs included.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from tessera.plugin_manager import Runtime
from tessera.testing.quant import quant_checks

NAMES = ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]
#: Byte offsets of each type's float16 fields in a block (ggml's block structs).
FP16_FIELDS = {
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q5_K": (0, 2),
}
SPECIAL_HALVES = np.array(
    [0x0000, 0x8000, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x83FF,
     0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x2E66],
    dtype=np.uint16,
)  # fmt: skip
RUNTIME = Runtime()


def stored_blocks(name: str, n: int = 4096) -> np.ndarray:
    """Blocks ``(n, type_size)`` of random bytes (seeded: at every position every code
    value occurs), float16 fields cycling through :data:`SPECIAL_HALVES` in every
    combination."""
    qt = RUNTIME.quant_type_by_name(name)
    blocks = np.random.default_rng(3).integers(0, 256, (n, qt.type_size), dtype=np.uint8)
    for k, at in enumerate(FP16_FIELDS[name]):
        pick = np.arange(n) // len(SPECIAL_HALVES) ** k % len(SPECIAL_HALVES)
        blocks[:, at : at + 2] = SPECIAL_HALVES[pick].astype("<u2").view(np.uint8).reshape(n, 2)
    return blocks


@pytest.mark.parametrize("name", NAMES)
def test_any_stored_block_decodes_as_gguf_bit_for_bit(name):
    qt = RUNTIME.quant_type_by_name(name)
    rows = stored_blocks(name).reshape(-1, 2 * qt.type_size)  # rows of two blocks
    with np.errstate(invalid="ignore", over="ignore"):
        theirs = gguf.quants.dequantize(rows, GGMLQuantizationType[name]).astype(np.float32)
    ours = qt.dequantize(rows)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    # the blocks reach every kind of result: NaN, infinities, subnormals, zeros of both signs
    bits = ours.view(np.uint32)
    assert np.isnan(ours).any() and np.isposinf(ours).any() and np.isneginf(ours).any()
    assert ((bits & 0x7F800000) == 0).any() and (bits == 0x80000000).any() and (bits == 0).any()


#: Scale bytes giving every group the scale 1 and min 0 (after d = 1, dmin = 0):
#: (offset, bytes). Q3_K stores sc + 32 = 33: low nibbles 1, top bits 2.
UNIT_GROUP_SCALES = {
    "Q2_K": (0, [0x01] * 16),
    "Q3_K": (96, [0x11] * 8 + [0xAA] * 4),
    "Q5_K": (4, [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]),
}
#: What each code decodes to at scale 1, min 0.
CODE_VALUES = {
    "Q4_1": range(16),
    "Q5_0": range(-16, 16),
    "Q5_1": range(32),
    "Q2_K": range(4),
    "Q3_K": range(-4, 4),
    "Q5_K": range(32),
}


@pytest.mark.parametrize("name", NAMES)
def test_every_code_at_every_position_decodes_as_gguf(name):
    """With scale 1 and min 0 each decoded value is its code: every code value occurs at
    every position of the block, and decodes as gguf.quants decodes it."""
    qt = RUNTIME.quant_type_by_name(name)
    blocks = stored_blocks(name)
    for k, at in enumerate(FP16_FIELDS[name]):
        blocks[:, at : at + 2] = np.array([0x3C00 if k == 0 else 0], "<u2").view(np.uint8)
    if name in UNIT_GROUP_SCALES:
        at, unit = UNIT_GROUP_SCALES[name]
        blocks[:, at : at + len(unit)] = unit
    theirs = gguf.quants.dequantize(blocks, GGMLQuantizationType[name]).astype(np.float32)
    ours = qt.dequantize(blocks)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    want = np.array(CODE_VALUES[name], np.float32)
    for position in range(qt.block_size):
        np.testing.assert_array_equal(np.unique(ours[:, position]), want)


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_error_is_what_the_bits_allow(name):
    """Relative RMS error of N(0, 1) data (measured: Q2_K 0.297, Q3_K 0.151, Q4_1 0.078,
    Q5_0 0.043, Q5_1 0.038, Q5_K 0.036); a nibble, bit or scale mistake gives ~1."""
    qt = RUNTIME.quant_type_by_name(name)
    x = np.random.default_rng(2).standard_normal((64, 1024)).astype(np.float32)
    error = np.sqrt(((qt.dequantize(qt.quantize(x)) - x) ** 2).mean() / (x**2).mean())
    bound = {"Q2_K": 0.31, "Q3_K": 0.16, "Q4_1": 0.082, "Q5_0": 0.045, "Q5_1": 0.04}
    assert error < bound.get(name, 0.038)


def test_registered_with_ggml_ids_and_layouts():
    for name in NAMES:
        qt = RUNTIME.quant_type_by_name(name)
        kind = GGMLQuantizationType[name]
        assert qt.ggml_type == int(kind)
        assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[kind]
        assert RUNTIME.quant_type(qt.ggml_type) is qt


CHECKS = [
    (name, check)
    for name in NAMES
    for check in quant_checks(
        RUNTIME.quant_type_by_name(name),
        RUNTIME,
        reference_quantize=(
            (lambda x, t=GGMLQuantizationType[name]: gguf.quants.quantize(x, t))
            if name in ("Q4_1", "Q5_0", "Q5_1")
            else None
        ),
        reference_dequantize=lambda b, t=GGMLQuantizationType[name]: gguf.quants.dequantize(b, t),
    )
]


@pytest.mark.parametrize("name, check", CHECKS, ids=[c.id for _, c in CHECKS])
def test_quant_kit(name, check):
    check.run()

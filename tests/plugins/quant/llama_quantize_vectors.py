"""Helpers of the quant tests: the llama-quantize vectors of tests/data/quants (see its
README) paired with their F32 sources, bit-for-bit comparisons, and stored blocks with
chosen float16 scales for the dequantize tests."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType

from tessera.files.gguf import read_gguf

DATA = Path(__file__).resolve().parents[2] / "data" / "quants"
#: Vector file prefix -> the F32 source it was made from.
SOURCES = {
    "llama-quantize-pure-": "source-f32.gguf",
    "llama-quantize-pure-edge-": "edge-f32.gguf",
    "llama-quantize-pure-edge-huge-": "edge-huge-f32.gguf",
}
#: float16 bit patterns a stored scale can hold: zeros of both signs, the smallest
#: subnormal, one, the largest finite values, infinities, NaNs (quiet, with payload).
SPECIAL_F16 = np.array(
    [0x0000, 0x8000, 0x0001, 0x3C00, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7D55],
    dtype=np.uint16,
)


@cache
def _read(name: str):
    return read_gguf(DATA / name)


def vector_tensors(prefix: str, type_name: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(tensor name, F32 source values, llama-quantize's bytes)`` of every 2-D tensor that
    the vector ``prefix + type_name`` stores as ``type_name``."""
    vector = _read(f"{prefix}{type_name}.gguf")
    source = _read(SOURCES[prefix])
    wanted = int(GGMLQuantizationType[type_name])
    found = []
    for name, tensor in vector.tensors.items():
        if len(tensor.shape) == 2 and tensor.ggml_type == wanted:
            values = source.tensors[name].data.view(np.float32).reshape(tensor.shape)
            found.append((name, values, np.asarray(tensor.data).reshape(tensor.shape[0], -1)))
    return found


def assert_quantizes_as_llama_quantize(qt, prefix: str, count: int) -> None:
    """``qt`` writes the bytes llama-quantize wrote for each of the ``count`` tensors of
    the ``prefix`` vectors stored in it."""
    tensors = vector_tensors(prefix, qt.name)
    assert len(tensors) == count
    for tensor_name, values, theirs in tensors:
        assert_blocks_equal(qt.quantize_tensor(values), theirs, qt.type_size, tensor_name)


def assert_vectors_dequantize_as_gguf(qt) -> None:
    """``qt`` reads the edge vectors stored in it bit for bit as ``gguf.quants`` does."""
    for _, _, stored in vector_tensors("llama-quantize-pure-edge-", qt.name):
        assert_bits_equal(qt.dequantize(stored), gguf_dequantize(stored, qt.name))


def assert_blocks_equal(ours: np.ndarray, theirs: np.ndarray, type_size: int, what: str) -> None:
    assert ours.dtype == np.uint8 and ours.size == theirs.size, f"{what}: {ours.shape}"
    differ = (ours.reshape(-1, type_size) != theirs.reshape(-1, type_size)).any(axis=1)
    first = np.flatnonzero(differ)[:5]
    assert not differ.any(), f"{what}: {int(differ.sum())} of {differ.size} blocks differ: {first}"


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Float32 results equal bit for bit (NaN payloads and signed zeros included)."""
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    theirs = np.ascontiguousarray(theirs, dtype=np.float32)
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    assert not differ.any(), (
        f"{int(differ.sum())} values differ, first at {np.argwhere(differ)[:3]}"
    )


def gguf_dequantize(data: np.ndarray, type_name: str) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return gguf.quants.dequantize(data, GGMLQuantizationType[type_name])


def random_blocks(type_name: str, n_blocks: int, seed: int, scale_at: int | None) -> np.ndarray:
    """``n_blocks`` random stored blocks ``(n_blocks, type_size)``; with ``scale_at``, the
    float16 scale at that byte offset cycles through :data:`SPECIAL_F16` in the first
    blocks and holds finite values of every magnitude in the others."""
    type_size = gguf.GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if scale_at is not None:
        finite = rng.integers(0, 0x7C00, n_blocks, dtype=np.uint16) | (
            rng.integers(0, 2, n_blocks, dtype=np.uint16) << 15
        )
        finite[: len(SPECIAL_F16)] = SPECIAL_F16[: min(n_blocks, len(SPECIAL_F16))]
        blocks[:, scale_at : scale_at + 2] = finite.astype("<u2").reshape(-1, 1).view(np.uint8)
    return blocks

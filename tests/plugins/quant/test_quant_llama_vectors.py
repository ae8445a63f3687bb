"""Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K: quantize bit for bit as llama-quantize, and decode
its output bit for bit as gguf.quants.

The oracle is tests/data/quants (see its README): llama.cpp's own ``llama-quantize --pure``
output for a random source and for an edge-case source (zeros, tiny, subnormal and
near-FP16-limit values, exact ties, single values, constants). In the edge files the tensors
with rows of 32 hold llama-quantize's fallback type (Q4_0, Q5_1), checked the same way.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from tessera.files.gguf import read_gguf
from tessera.plugin_manager import Runtime

DATA = Path(__file__).resolve().parents[2] / "data" / "quants"
NAMES = ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]
#: (source, prefix of the vectors' file names)
SOURCES = [
    ("source-f32.gguf", "llama-quantize-pure-"),
    ("edge-f32.gguf", "llama-quantize-pure-edge-"),
]
RUNTIME = Runtime()


def reference_tensors(prefix, name):
    ref = read_gguf(DATA / f"{prefix}{name}.gguf")
    return {n: t for n, t in ref.tensors.items() if len(t.shape) == 2}


@pytest.mark.parametrize("source_file, prefix", SOURCES, ids=["random", "edge"])
@pytest.mark.parametrize("name", NAMES)
def test_quantize_reproduces_llama_quantize_bytes(name, source_file, prefix):
    source = read_gguf(DATA / source_file)
    tensors = reference_tensors(prefix, name)
    # the type itself wherever its blocks fit the rows, a fallback type elsewhere
    block = RUNTIME.quant_type_by_name(name).block_size
    fits = {n for n, t in tensors.items() if t.shape[-1] % block == 0}
    own = {n for n, t in tensors.items() if t.ggml_type == int(GGMLQuantizationType[name])}
    assert len(tensors) == 9 and own == fits and len(own) >= 7
    for tensor_name, ref in tensors.items():
        qt = RUNTIME.quant_type(ref.ggml_type)
        values = source.tensors[tensor_name].data.view(np.float32).reshape(ref.shape)
        ours = qt.quantize_tensor(values)
        theirs = np.asarray(ref.data)
        assert ours.shape == theirs.shape
        blocks_differ = (ours.reshape(-1, qt.type_size) != theirs.reshape(-1, qt.type_size)).any(1)
        assert not blocks_differ.any(), (
            f"{tensor_name} ({qt.name}): {blocks_differ.sum()} of {blocks_differ.size} blocks "
            f"differ, first {np.flatnonzero(blocks_differ)[:5]}"
        )


@pytest.mark.parametrize("prefix", [p for _, p in SOURCES], ids=["random", "edge"])
@pytest.mark.parametrize("name", NAMES)
def test_dequantize_llama_quantize_output_matches_gguf_bit_for_bit(name, prefix):
    for ref in reference_tensors(prefix, name).values():
        qt = RUNTIME.quant_type(ref.ggml_type)
        data = np.asarray(ref.data).reshape(ref.shape[0], -1)
        theirs = gguf.quants.dequantize(data, GGMLQuantizationType(ref.ggml_type))
        ours = qt.dequantize(data)
        assert ours.dtype == np.float32 and ours.shape == ref.shape
        np.testing.assert_array_equal(
            ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)
        )

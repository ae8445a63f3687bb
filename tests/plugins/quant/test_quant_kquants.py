"""Q4_K and Q6_K: quantize bit for bit as llama-quantize, dequantize bit for bit as gguf.quants.

The quantize oracle is tests/data/kquants: every 2-D tensor of a small model quantized by
llama.cpp's own ``llama-quantize --pure`` (see its README). ``gguf.quants`` cannot write
K-types, but it decodes them, so it is the dequantize oracle.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from tessera.files.gguf import read_gguf
from tessera.plugin_manager import Runtime

DATA = Path(__file__).resolve().parents[2] / "data" / "kquants"
NAMES = ["Q4_K", "Q6_K"]
RUNTIME = Runtime()


@pytest.fixture(scope="module")
def source():
    return read_gguf(DATA / "source-f32.gguf")


def reference_tensors(name):
    ref = read_gguf(DATA / f"llama-quantize-pure-{name}.gguf")
    return {n: t for n, t in ref.tensors.items() if len(t.shape) == 2}


@pytest.mark.parametrize("name", NAMES)
def test_quantize_reproduces_llama_quantize_bytes(name, source):
    qt = RUNTIME.quant_type_by_name(name)
    tensors = reference_tensors(name)
    assert len(tensors) == 9
    for tensor_name, ref in tensors.items():
        assert ref.ggml_type == int(GGMLQuantizationType[name])
        values = source.tensors[tensor_name].data.view(np.float32).reshape(ref.shape)
        ours = qt.quantize_tensor(values)
        theirs = np.asarray(ref.data)
        assert ours.shape == theirs.shape
        blocks_differ = (ours.reshape(-1, qt.type_size) != theirs.reshape(-1, qt.type_size)).any(1)
        assert not blocks_differ.any(), f"{tensor_name}: {blocks_differ.sum()} blocks differ"


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_gguf_bit_for_bit(name):
    qt = RUNTIME.quant_type_by_name(name)
    for ref in reference_tensors(name).values():
        data = np.asarray(ref.data).reshape(ref.shape[0], -1)
        theirs = gguf.quants.dequantize(data, GGMLQuantizationType[name]).astype(np.float32)
        ours = qt.dequantize(data)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def edge_rows() -> np.ndarray:
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((8, 512)).astype(np.float32)
    rows[0] = 0.0  # all zero: every scale 0
    rows[1, :256] = 0.0  # a zero super-block next to a normal one
    rows[2, :16] = 0.0  # one zero group inside a super-block
    rows[3] = np.abs(rows[3])  # all positive: the min clamps to 0
    rows[4] = -np.abs(rows[4])  # all negative
    rows[5, :32] = 2.5  # a constant group
    rows[6] *= np.float32(1e-3)
    rows[7] = np.round(rows[7] * 4) / 4  # many exact ties
    return rows


@pytest.mark.parametrize("name", NAMES)
def test_edge_cases_decode_with_gguf_and_stay_close(name):
    qt = RUNTIME.quant_type_by_name(name)
    rows = edge_rows()
    data = qt.quantize(rows)
    assert data.shape == (8, 2 * qt.type_size) and data.dtype == np.uint8
    decoded = qt.dequantize(data)
    reference = gguf.quants.dequantize(data, GGMLQuantizationType[name]).astype(np.float32)
    np.testing.assert_array_equal(decoded, reference)
    np.testing.assert_array_equal(decoded[0], 0.0)
    np.testing.assert_array_equal(decoded[1, :256], 0.0)
    # relative RMS error per row: ~0.07 for 4 bits, ~0.02 for 6 (a layout mistake gives ~1)
    bound = {"Q4_K": 0.08, "Q6_K": 0.025}[name]
    rms = np.sqrt((rows[1:] ** 2).mean(axis=1))
    assert (np.sqrt(((decoded[1:] - rows[1:]) ** 2).mean(axis=1)) / rms < bound).all()


def test_registered_with_ggml_ids_and_layouts():
    for name in NAMES:
        qt = RUNTIME.quant_type_by_name(name)
        assert qt.ggml_type == int(GGMLQuantizationType[name])
        assert (qt.block_size, qt.type_size) == gguf.GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert RUNTIME.quant_type(qt.ggml_type) is qt


@pytest.mark.parametrize("name", NAMES)
def test_torch_kernel_matches_dequantize(name):
    backend = RUNTIME.create_backend("torch", "cpu", "f32")
    kernel = RUNTIME.weight_kernels()[("torch", name)]
    assert not kernel.supports(backend)  # on the CPU the dense fallback is faster
    qt = RUNTIME.quant_type_by_name(name)
    from tessera.files.gguf import RawTensor

    rows = edge_rows()
    raw = RawTensor("w", qt.ggml_type, rows.shape, qt.quantize_tensor(rows))
    weight = kernel.load(backend, raw)
    dense = qt.dequantize_tensor(raw.data, rows.shape)
    x = np.random.default_rng(1).standard_normal((3, rows.shape[1])).astype(np.float32)
    got = backend.to_numpy(weight.matmul(backend.from_numpy(x)))
    np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=1e-4)
    rows_got = backend.to_numpy(weight.get_rows(np.array([2, 0])))
    np.testing.assert_array_equal(rows_got, dense[[2, 0]])
    assert weight.shape == rows.shape

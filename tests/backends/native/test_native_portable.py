"""The portable decode GEMV (``native_qgemv_portable.c``, plain C loops): every type it
takes against the gguf package's dequantization in float64 within the int8-activation bound
and against the same activation rounding done in numpy within float32 sums, on random block
bytes (every code and scale byte) and on gguf-quantized values; f32/bf16/f16 activations,
several weights with biases in one call, 1-2 threads; and the C file built alone for a
baseline x86-64 (no AVX: no intrinsics hide in it) giving the same bits."""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch
from gguf_checks import int8_activations, with_threads  # a sibling module

from tessera.backends.native import iq_tables, library, selftest
from tessera.backends.native.portable_gemv import PORTABLE_TYPES

KINDS = list(PORTABLE_TYPES)
#: Byte offsets of each block's float16 fields (scales, mins).
F16_FIELDS = {**selftest.F16_FIELDS, "Q8_0": (0,), "Q4_0": (0,)}


def random_blocks(kind, n_out, n_in, rng):
    """Random bytes with finite float16 fields N(0, 0.01), as the self-test makes them."""
    from gguf import GGMLQuantizationType, quants

    if kind == "IQ1_M":  # its d is spread over the top nibbles of the scales
        return selftest.random_blocks(kind, n_out, n_in, rng)
    block, size = quants.GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, (n_out, n_in // block * size), dtype=np.uint8)
    blocks = raw.reshape(n_out, -1, size)
    for at in F16_FIELDS[kind]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype("<f2")
        blocks[:, :, at : at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out,n_in,rows", [(1, 256, 1), (7, 512, 2), (37, 768, 5)])
def test_portable_gemv_matches_gguf_within_the_int8_activation_bound(
    native, kind, threads, n_out, n_in, rows
):
    rng = np.random.default_rng(n_out + rows)
    raw = random_blocks(kind, n_out, n_in, rng)
    dense = selftest._GgufOracle(kind).dequantize(raw).astype(np.float64)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    got = with_threads(
        threads,
        lambda: native.gemv_portable(kind, (torch.from_numpy(raw),), torch.from_numpy(x)),
    ).numpy()
    want = x.astype(np.float64) @ dense.T
    assert got.dtype == np.float32 and got.shape == (rows, n_out)
    assert np.all(np.abs(got - want) <= selftest.error_bound(dense, x))
    xq = int8_activations(x)
    assert np.all(np.abs(got - xq @ dense.T) <= 1e-5 * (np.abs(xq) @ np.abs(dense).T) + 1e-30)


@pytest.mark.parametrize(
    "kind", [k for k in KINDS if k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")]
)
def test_portable_gemv_on_gguf_quantized_values(native, kind):
    """Values gguf.quants quantizes itself (the types it can write), with a zero row."""
    rng = np.random.default_rng(1)
    values = rng.standard_normal((9, 512)).astype(np.float32)
    values[0] = 0
    oracle = selftest._GgufOracle(kind)
    raw = oracle.quantize(values)
    dense = oracle.dequantize(raw).astype(np.float64)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    got = native.gemv_portable(kind, (torch.from_numpy(raw),), torch.from_numpy(x)).numpy()
    assert np.all(np.abs(got - x.astype(np.float64) @ dense.T) <= selftest.error_bound(dense, x))
    assert np.all(got[:, 0] == 0)


@pytest.mark.parametrize("kind", KINDS)
def test_portable_gemv_in_16_bit_dtypes_with_several_weights_and_biases(native, kind):
    rng = np.random.default_rng(3)
    raws = [random_blocks(kind, n, 512, rng) for n in (9, 4, 6)]
    oracle = selftest._GgufOracle(kind)
    dense = np.concatenate([oracle.dequantize(r) for r in raws]).astype(np.float64)
    for dtype, step in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        x = torch.from_numpy(rng.standard_normal((3, 512)).astype(np.float32)).to(dtype)
        bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).to(dtype)
        got = native.gemv_portable(kind, tuple(map(torch.from_numpy, raws)), x, (None, bias, None))
        assert got.dtype == dtype and got.shape == (3, 19)
        xs = x.float().numpy()
        want = xs.astype(np.float64) @ dense.T
        want[:, 9:13] += bias.float().numpy()
        bound = selftest.error_bound(dense, xs) + step * np.abs(want)
        assert np.all(np.abs(got.float().numpy() - want) <= bound)


def test_a_type_without_a_portable_kernel_is_refused_by_name(native):
    with pytest.raises(ValueError, match="no portable IQ4_XS matmul"):
        native.gemv_portable(
            "IQ4_XS", (torch.zeros(1, 136, dtype=torch.uint8),), torch.ones(1, 256)
        )


def test_the_c_file_alone_builds_for_baseline_x86_64_and_gives_the_same_values(native, tmp_path):
    """No intrinsics: the file compiles for plain x86-64 (SSE2, no AVX) and its results
    equal the -march=native library's within float32 rounding of the same sums."""
    cc = "cc"
    out = tmp_path / "portable.so"
    source = library.SOURCES[0].parent / "native_qgemv_portable.c"
    iq_tables.write_header(tmp_path)  # the grid types' tables, generated from gguf.quants
    done = subprocess.run(
        [cc, "-O2", "-march=x86-64", "-mno-avx", "-shared", "-fPIC", f"-I{tmp_path}", "-o",
         str(out), str(source), "-lm"], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fn = ctypes.CDLL(str(out)).tsr_gemv_quant_portable
    fn.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    fn.argtypes += [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    rng = np.random.default_rng(5)
    for kind in KINDS:
        raw = random_blocks(kind, 5, 512, rng)
        x = rng.standard_normal((2, 512)).astype(np.float32)
        y = np.zeros((2, 5), np.float32)
        ws, n_outs = (ctypes.c_void_p * 1)(raw.ctypes.data), (ctypes.c_int64 * 1)(5)
        ok = fn(
            PORTABLE_TYPES[kind], 1, ws, n_outs, None, 512, x.ctypes.data, 2, y.ctypes.data, 0, 1
        )
        want = native.gemv_portable(kind, (torch.from_numpy(raw),), torch.from_numpy(x)).numpy()
        assert ok == 1
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

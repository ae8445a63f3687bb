"""Q4_0 in the native 4-row layout (tessera.backends.native.q4_0_x4): on each code path
(AVX512-VNNI, 256-bit AVX-VNNI, AVX2) the decode GEMV of repacked weights against gguf's
dequantization within the int8-activation bound and bit for bit the file layout's result;
the repacking and the file's rows taken back exactly; the torch weights' choice of layout,
its switch, and every path that needs the file's rows (prefill, AMX tiles, get_rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_checks import with_threads  # a sibling module

from tessera.backends.native import cpu_paths, library, selftest
from tessera.backends.native.q4_0_x4 import KIND, layout_choice
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
ORACLE = selftest._GgufOracle("Q4_0")
#: The paths a library build takes, with the /proc/cpuinfo flags each needs.
PATHS = ("avx512-vnni", "avx-vnni", "avx2")


@pytest.fixture(scope="module", params=PATHS)
def path_lib(request, native):
    """The library built for one code path (skipped where the CPU lacks its flags)."""
    path = request.param
    missing = [f for f in cpu_paths.PATH_CPU_FLAGS[path] if f not in library.cpu_flags()]
    if missing:
        # Real skip: a narrower build cannot run without its instructions; this project's
        # machines have all three paths
        pytest.skip(f"this CPU lacks {', '.join(missing)}")
    flags = cpu_paths.build_flags(path, library.CFLAGS)
    gemv = library.load(library.build(flags=flags))
    assert cpu_paths.quant_path(gemv.isa, False) == path
    return gemv


def random_q4_0(n_out, n_in, rng):
    """gguf-quantized random weights with the extreme codes 0 and 15 and a zero block."""
    raw = ORACLE.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32))
    blocks = raw.reshape(n_out, -1, 18)
    blocks[0, 0, 2:] = np.arange(16, dtype=np.uint8) * 17
    blocks[-1, -1] = 0
    return raw


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_repacked_gemv_matches_gguf_and_the_file_layout(path_lib, threads, rows, dtype):
    rng = np.random.default_rng(rows * 10 + threads)
    raws = [random_q4_0(n, 256, rng) for n in (36, 8, 4)]
    files = tuple(torch.from_numpy(r) for r in raws)
    packed = tuple(path_lib.repack_q4_0_x4(f) for f in files)
    bias = torch.from_numpy(rng.standard_normal(8).astype(np.float32)).to(dtype)
    x = torch.from_numpy(rng.standard_normal((rows, 256)).astype(np.float32)).to(dtype)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    biases = (None, bias, None)
    got = with_threads(threads, lambda: path_lib.matmul_n(KIND, packed, x, biases))
    file_layout = with_threads(threads, lambda: path_lib.matmul_n("Q4_0", files, x, biases))
    assert torch.equal(got, file_layout)  # the same sums in the same order
    one = with_threads(threads, lambda: path_lib.matmul(KIND, packed[0], x))
    assert torch.equal(one, path_lib.matmul("Q4_0", files[0], x))
    dense = np.concatenate([ORACLE.dequantize(r) for r in raws]).astype(np.float64)
    xs = x.float().numpy()
    want = xs.astype(np.float64) @ dense.T
    want[:, 36:44] += bias.float().numpy()
    rounding = 0.0 if dtype == torch.float32 else 2.0**-8
    bound = selftest.error_bound(dense, xs) + rounding * np.abs(want)
    assert np.all(np.abs(got.float().numpy() - want) <= bound)


def test_repacking_keeps_the_bytes_and_gives_the_files_rows_back(native):
    rng = np.random.default_rng(3)
    raw = torch.from_numpy(random_q4_0(12, 96, rng))
    packed = native.repack_q4_0_x4(raw)
    assert packed.shape == raw.shape and packed.dtype == torch.uint8
    assert not torch.equal(packed, raw)  # rearranged ...
    assert sorted(packed.flatten().tolist()) == sorted(raw.flatten().tolist())  # ... not changed
    # group 1's block 0: rows 4..7's code bytes one after another
    assert torch.equal(packed.flatten()[3 * 64 : 4 * 64], raw[4:8, 2:18].flatten())
    assert torch.equal(native.unpack_q4_0_x4(packed), raw)
    ids = torch.tensor([11, 0, 5, 5])
    assert torch.equal(native.unpack_q4_0_x4(packed, ids), raw[ids])
    with pytest.raises(IndexError, match="row ids must be in 0..11"):
        native.unpack_q4_0_x4(packed, torch.tensor([12]))
    with pytest.raises(ValueError, match="multiple of 4"):
        native.repack_q4_0_x4(raw[:6])


def test_the_kernel_refuses_rows_that_are_no_whole_group(native):
    rng = np.random.default_rng(4)
    packed = native.repack_q4_0_x4(torch.from_numpy(random_q4_0(8, 64, rng)))
    x = torch.zeros((1, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Q4_0_x4 matmul does not take"):
        native.matmul(KIND, packed[:6], x)


def load(b, n_out, n_in, rng):
    qt = RUNTIME.quant_type_by_name("Q4_0")
    raw = random_q4_0(n_out, n_in, rng)
    return b.load_weight(RawTensor("w", qt.ggml_type, (n_out, n_in), raw.reshape(-1)), qt), raw


def backend():
    b = RUNTIME.create_backend("torch", device="cpu", dtype="bf16")
    RUNTIME.equip(b)
    return b


def test_torch_weights_take_the_layout_and_the_switch_keeps_the_files(native, monkeypatch):
    rng = np.random.default_rng(5)
    on = backend()
    w, raw = load(on, 64, 128, rng)
    assert w.kind == KIND and w.native_gemv(1)[0] == KIND
    assert on.paths["Q4_0 layout"].path == KIND
    assert torch.equal(w.file_rows(), torch.from_numpy(raw))
    odd, _ = load(on, 30, 128, rng)  # rows that are no whole 4-row group: the file's layout
    assert odd.kind == "Q4_0"
    monkeypatch.setenv("TESSERA_NATIVE_Q4_0_REPACK", "0")
    off = backend()
    w_off, _ = load(off, 64, 128, np.random.default_rng(5))
    assert w_off.kind == "Q4_0" and torch.equal(w_off.raw, torch.from_numpy(raw))
    choice = off.paths["Q4_0 layout"]
    assert choice.path == "Q4_0" and "disabled by TESSERA_NATIVE_Q4_0_REPACK=0" in choice.reason
    # every row count and get_rows: the same values from either layout
    for rows in (1, 5, 16, 40, 70, 100):
        x = on.from_numpy(rng.standard_normal((rows, 128)).astype(np.float32))
        assert torch.equal(on.matmul(x, w), off.matmul(x, w_off)), rows
    ids = np.array([63, 0, 17])
    assert torch.equal(w.get_rows(ids), w_off.get_rows(ids))
    assert torch.equal(w.int4()[0], w_off.int4()[0])


def test_the_portable_path_keeps_the_files_layout(native):
    class Portable:
        portable, isa = True, native.isa

    choice = layout_choice(Portable())
    assert choice.path == "Q4_0" and "portable path reads the file's layout" in choice.reason
    assert layout_choice(native).path == KIND

"""The native kernels of the grid types IQ2_XXS, IQ3_XXS, IQ2_XS, IQ3_S, IQ2_S, IQ1_S and
IQ1_M on each CPU code path (AVX512-VNNI, AVX-VNNI 256, AVX2 forced by compiler flags, and
the portable C loops): the decode GEMV against ``gguf.quants`` dequantize @ x in float64
within the int8-activation bound, the prefill dequantization bit for bit the oracle's
values, on random block bytes (every grid index, sign and scale) and edge blocks; the
tables generated from gguf; the torch weights on them, the switches and the paths report.

tessera does not write these types (they need an importance matrix), so the weights are
random block bytes with finite float16 fields, not a quantization of values.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from gguf_checks import check_against_gguf  # noqa: E402 (a sibling module)

from tessera.backends.native import cpu_paths, iq_tables, library, selftest
from tessera.backends.native.typed_gemv import GRID_TYPES
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime
from tessera.plugins.quant import iq_grid
from tessera.plugins.quant.native_weight import NativeBlockWeight

RUNTIME = Runtime()
#: (compiler flags, the CPU flag the build needs, 512-bit kernels, VNNI, portable GEMV).
PATHS = {
    "avx512-vnni": ((), "avx512_vnni", 1, 1, False),
    "avx-vnni-256": (("-mno-avx512f",), "avx_vnni", 0, 1, False),
    "avx2-maddubs": (("-mno-avx512f", "-mno-avxvnni"), "avx2", 0, 0, False),
    "portable": ((), "avx2", None, None, True),
}
F16_MAX = np.array([65504.0], "<f2").view(np.uint8)


@pytest.fixture(scope="module", params=list(PATHS))
def path_lib(request, tmp_path_factory):
    flags, needs, zmm, vnni, portable = PATHS[request.param]
    if needs not in library.cpu_flags():
        # Real skip: a build for this path runs only on a CPU with its instructions
        pytest.skip(f"this CPU has no {needs}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("native-cache")))
        lib = library.load(library.build(flags=library.CFLAGS + flags))
    if zmm is not None:
        assert (lib.lib.tsr_native_zmm(), lib.lib.tsr_native_vnni()) == (zmm, vnni)
    lib.portable = portable  # matmuls on the plain C loops (TESSERA_NATIVE_PATH=portable)
    return lib


def test_the_generated_tables_are_gguf_grids_and_signs():
    """The header's tables, read back from its text, are gguf's grids (IQ1's times 8) and
    ksigns."""
    text = iq_tables.header_text()

    def table(name):
        body = re.search(rf"{name}\[(\d+)\] = {{([^}}]*)}}", text)
        return [int(v, 16) for v in body.group(2).split(",")]

    for c_name, gguf_name, factor in iq_tables.GRIDS:
        width = iq_grid.GRIDS[gguf_name].shape[1]
        packed = np.array(table(c_name), dtype=np.uint64 if width == 8 else np.uint32)
        points = packed.view(np.int8).reshape(-1, width).astype(np.float32)
        np.testing.assert_array_equal(points, iq_grid.GRIDS[gguf_name] * factor)
    assert table("TSR_KSIGNS") == [int(v) for v in iq_grid.KSIGNS]


@pytest.mark.parametrize("kind", GRID_TYPES)
def test_random_blocks_multiply_and_dequantize_as_gguf(path_lib, kind):
    rng = np.random.default_rng(1)
    for n_out, n_in in ((1, 256), (7, 512), (13, 768)):
        check_against_gguf(path_lib, kind, selftest.random_blocks(kind, n_out, n_in, rng))


def edge_blocks(kind, rng):
    """Rows of ``kind`` blocks: all zero bytes; the float16 maximum as d with random codes
    and scales; the same with every scale, index and sign byte at its largest."""
    from gguf import GGMLQuantizationType, quants

    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    rows = selftest.random_blocks(kind, 3, 512, rng)
    blocks = rows.reshape(3, -1, size)
    blocks[0] = 0
    blocks[2] = 255
    for b in (blocks[1], blocks[2]):
        if kind == "IQ1_M":  # d's nibbles on top of the scale words
            d = int(F16_MAX.view("<u2")[0])
            words = b[:, 48:56].copy().view("<u2")
            for k in range(4):
                words[:, k] = (words[:, k] & 0x0FFF) | ((d >> 4 * k) & 15) << 12
            b[:, 48:56] = words.view(np.uint8)
        else:
            b[:, 0:2] = F16_MAX
    return rows


@pytest.mark.parametrize("kind", GRID_TYPES)
def test_edge_blocks_multiply_and_dequantize_as_gguf(path_lib, kind):
    raw = edge_blocks(kind, np.random.default_rng(2))
    dense = selftest._GgufOracle(kind).dequantize(raw)
    assert not dense[0].any() and np.abs(dense[1:]).max() >= 65504
    check_against_gguf(path_lib, kind, raw)
    # A zero block is zero however large the activations are
    x = torch.full((1, 512), 1e4, dtype=torch.bfloat16)
    assert path_lib.matmul(kind, torch.from_numpy(raw[:1]), x).float().abs().max() == 0


def backend():
    b = RUNTIME.create_backend("torch", device="cpu", dtype="bf16")
    RUNTIME.equip(b)
    return b


def raw_tensor(kind, n_out=40, n_in=512, seed=8):
    raw = selftest.random_blocks(kind, n_out, n_in, np.random.default_rng(seed))
    qt = RUNTIME.quant_type_by_name(kind)
    dense = selftest._GgufOracle(kind).dequantize(raw).astype(np.float64)
    return RawTensor("blk.0.ffn_up.weight", qt.ggml_type, (n_out, n_in), raw.reshape(-1)), qt, dense


@pytest.mark.parametrize("kind", GRID_TYPES)
def test_torch_weights_keep_the_file_bytes_and_decode_natively(native, kind):
    """The weight is the file's bytes (no dense copy); decode rows run the GEMV, prefill
    rows the native dequantization; the paths report names the type's code path."""
    raw, qt, dense = raw_tensor(kind)
    b = backend()
    w = b.load_weight(raw, qt)
    assert isinstance(w, NativeBlockWeight) and w.raw.numpy().nbytes == raw.data.nbytes
    assert b.paths[f"quant decode GEMV {kind}"].path == cpu_paths.quant_path(native.isa, False)
    x = np.random.default_rng(9).standard_normal((w.max_rows, 512)).astype(np.float32)
    for rows in (1, w.max_rows):
        xb = b.to_numpy(b.from_numpy(x[:rows]))  # the bf16 activations
        want = xb.astype(np.float64) @ dense.T
        got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
        bound = selftest.error_bound(dense, xb) + 2.0**-7 * np.abs(want) + 1e-2 * np.abs(want).max()
        assert np.all(np.abs(got - want) <= bound)
    ids = np.array([3, 0, 3, 39])
    rows = torch.from_numpy(dense[ids].astype(np.float32)).bfloat16()
    assert torch.equal(b.get_rows(w, ids), rows)


@pytest.mark.parametrize(
    "env,kind,expect",
    [({"TESSERA_NATIVE_QUANT_DISABLE": "iq2_xxs,IQ1_M"}, "IQ2_XXS", "torch"),
     ({"TESSERA_NATIVE_QUANT_DISABLE": "IQ2_XXS"}, "IQ3_S", "native"),
     ({"TESSERA_NATIVE_QUANT_DISABLE": "all"}, "IQ1_S", "torch"),
     ({"TESSERA_NATIVE_DISABLE": "1"}, "IQ2_S", "torch"),
     ({"TESSERA_NATIVE_PATH": "portable"}, "IQ3_XXS", "portable")],
)  # fmt: skip
def test_switches_turn_a_grid_type_off_or_force_its_path(native, monkeypatch, env, kind, expect):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    raw, qt, dense = raw_tensor(kind)
    b = backend()
    w = b.load_weight(raw, qt)
    assert isinstance(w, NativeBlockWeight) == (expect != "torch")
    paths = {"torch": cpu_paths.FALLBACK, "portable": "portable"}
    path = paths.get(expect, cpu_paths.quant_path(native.isa, False))
    assert b.paths[f"quant decode GEMV {kind}"].path == path
    x = np.random.default_rng(10).standard_normal((2, 512)).astype(np.float32)
    want = x @ dense.T
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()

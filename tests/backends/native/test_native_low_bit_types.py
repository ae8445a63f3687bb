"""The native kernels of the low-bit block types Q2_K, Q3_K, TQ1_0 and NVFP4 on each CPU code
path (forced by compiler flags): the decode GEMV against ``gguf.quants`` dequantize @ x in
float64 within the int8-activation bound, and the prefill dequantization bit for bit the
oracle's values, on NVFP4 rows whose width is not a multiple of 256 and on edge blocks
(all-zero blocks, the largest scales and codes, NVFP4's scale bytes that read as 0).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_checks import check_against_gguf  # noqa: E402 (a sibling module)

from tessera.backends.native import library, selftest

LOW_BIT = ["Q2_K", "Q3_K", "TQ1_0", "NVFP4"]
#: (compiler flags, the CPU flag the build needs, 512-bit kernels, VNNI).
PATHS = {
    "avx512-vnni": ((), "avx512_vnni", 1, 1),
    "avx-vnni-256": (("-mno-avx512f",), "avx_vnni", 0, 1),
    "avx2-maddubs": (("-mno-avx512f", "-mno-avxvnni"), "avx2", 0, 0),
}
#: The largest float16 scale: every product of the types stays finite in float32.
F16_MAX = np.array([65504.0], "<f2").view(np.uint8)


@pytest.fixture(scope="module", params=list(PATHS))
def path_lib(request, tmp_path_factory):
    flags, needs, zmm, vnni = PATHS[request.param]
    if needs not in library.cpu_flags():
        # Real skip: a build for this path runs only on a CPU with its instructions
        pytest.skip(f"this CPU has no {needs}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("native-cache")))
        lib = library.load(library.build(flags=library.CFLAGS + flags))
    assert (lib.lib.tsr_native_zmm(), lib.lib.tsr_native_vnni()) == (zmm, vnni)
    return lib


@pytest.mark.parametrize("kind", LOW_BIT)
def test_random_blocks_multiply_and_dequantize_as_gguf(path_lib, kind):
    rng = np.random.default_rng(1)
    for n_out, n_in in ((1, 256), (7, 512), (13, 768)):
        check_against_gguf(path_lib, kind, selftest.random_blocks(kind, n_out, n_in, rng))


@pytest.mark.parametrize("n_in", [64, 192, 320, 448, 960])
def test_nvfp4_rows_off_the_256_grid(path_lib, n_in):
    """NVFP4's blocks are 64 values: rows of any multiple of 64 run natively."""
    assert path_lib.typed_serves("NVFP4", n_in) and not path_lib.typed_serves("NVFP4", n_in + 32)
    raw = selftest.random_blocks("NVFP4", 9, n_in, np.random.default_rng(n_in))
    check_against_gguf(path_lib, "NVFP4", raw, rows=5, seed=n_in)


def edge_blocks(kind, rng):
    """Rows of ``kind`` blocks: all zero bytes; random codes with the largest scales (and
    mins) and the float16 maximum; every code at its largest; and random bytes."""
    from gguf import GGMLQuantizationType, quants

    size = quants.GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    rows = selftest.random_blocks(kind, 4, 512, rng)
    blocks = rows.reshape(4, -1, size)
    blocks[0] = 0
    blocks[2] = 255  # every code at its largest (and, for TQ1_0, bytes past the last trit)
    for b in (blocks[1], blocks[2]):
        if kind == "Q2_K":
            b[:, :16] = 0xFF  # scale and min nibbles 15
            b[:, 80:82] = b[:, 82:84] = F16_MAX
        elif kind == "Q3_K":
            b[:, 96:108] = 0  # every group scale -32, the most negative
            b[:, 108:110] = F16_MAX
        elif kind == "TQ1_0":
            b[:, 52:54] = F16_MAX
        else:  # NVFP4: 0x7E (448 / 2), 0xFF (top bit ignored), 0x7F and 0x80 (read as 0)
            b[:, :4] = [0x7E, 0xFF, 0x7F, 0x80]
    return rows


@pytest.mark.parametrize("kind", LOW_BIT)
def test_edge_blocks_multiply_and_dequantize_as_gguf(path_lib, kind):
    raw = edge_blocks(kind, np.random.default_rng(2))
    dense = selftest._GgufOracle(kind).dequantize(raw)
    # NVFP4's largest: scale byte 0xFF reads 480, halved, times the doubled code 12
    assert not dense[0].any() and np.abs(dense[1:3]).max() >= 2880
    check_against_gguf(path_lib, kind, raw, rows=4)
    # A zero block is zero however large the activations are
    x = torch.full((1, 512), 1e4, dtype=torch.bfloat16)
    assert path_lib.matmul(kind, torch.from_numpy(raw[:1]), x).float().abs().max() == 0

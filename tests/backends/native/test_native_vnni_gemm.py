"""The int8 VNNI prefill GEMM of CPUs without AMX (``native_vnni_gemm.c``): every type it
reads against its ``gguf.quants`` dequantization times x in float64 and the fused SwiGLU, on
each of its builds (AVX512-VNNI, AVX-VNNI and AVX2, forced by ``TESSERA_NATIVE_PATH`` where
the CPU has them), its choice (AMX first, the switch, the portable path) and its use by the
torch backend's weights of those types when the AMX tiles are switched off.

Tolerance (:func:`~tessera.backends.native.selftest.error_bound`): each activation is
rounded to an int8 block code (off by at most half a step, max|block| / 254), the integer
sums are exact, float32 sums, plus the output's one rounding to bf16 / f16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tessera.backends.native import kernels, library, vnni_gemm
from tessera.backends.native import probe as native_probe
from tessera.backends.native.selftest import error_bound
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 0.0}


def _backend(dtype="bf16"):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    RUNTIME.equip(b)
    return b


#: The GEMM's builds by TESSERA_NATIVE_PATH, and the CPU flag each needs (None: AVX2 only).
GEMM_PATHS = {"avx512-vnni": "avx512_vnni", "avx-vnni": "avx_vnni", "avx2": None}


def _probe_without_amx(path="auto"):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(library.AMX_DISABLE_ENV, "1")
        mp.setenv("TESSERA_NATIVE_PATH", path)
        native = native_probe.probe(_backend())
    assert native is not None and native.vnni_gemm, native and native.vnni_gemm_choice
    return native


def _skip_unless_the_cpu_runs(path):
    flag = GEMM_PATHS[path]
    if flag and flag not in library.cpu_flags():
        # Real skip: a build for this path runs only on a CPU with its instructions (AMD
        # Zen 4 has AVX512-VNNI but no AVX-VNNI); the AVX2 build runs everywhere
        pytest.skip(f"this CPU has no {flag}")


@pytest.fixture(scope="module", params=list(GEMM_PATHS))
def gemm(request):
    """The kernels of one build with the AMX tiles switched off, so the GEMM takes prefill."""
    _skip_unless_the_cpu_runs(request.param)
    return _probe_without_amx(request.param)


@pytest.fixture(scope="module")
def widest():
    """The kernels of this CPU's widest build with the AMX tiles switched off."""
    return _probe_without_amx()


def _weights(kind, n_out, n_in, seed, count=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        raw = vnni_gemm.random_blocks(kind, n_out, n_in, rng)
        out.append((torch.from_numpy(raw), quants.dequantize(raw, GGMLQuantizationType[kind])))
    return out


def _x(rows, n_in, dtype, seed):
    x = np.random.default_rng(seed).standard_normal((rows, n_in)).astype(np.float32) * 3
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("kind", list(vnni_gemm.VNNI_GGML_TYPES))
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    # the fewest rows it takes; an odd block count and a ragged last group of 4 rows; n_in
    # not a multiple of 256; the 0.5B model's widths
    "n_out,n_in,rows",
    [(32, 32, 16), (96, 160, 35), (64, 96, 17), (128, 896, 33), (64, 4864, 18)],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_matches_the_dequantized_weight(
    gemm, kind, threads, n_out, n_in, rows, dtype, monkeypatch
):
    monkeypatch.setattr(gemm, "_threads", lambda: threads)
    ((raw, dense),) = _weights(kind, n_out, n_in, seed=n_out + rows)
    x = _x(rows, n_in, dtype, seed=rows)
    xs = x.double().numpy()
    want = xs @ dense.astype(np.float64).T
    for out_dtype in (dtype, torch.float32):
        got = gemm.matmul_vnni(kind, (raw,), x, out_dtype)
        assert got.dtype == out_dtype and got.shape == (rows, n_out)
        bound = error_bound(dense, xs) + ROUNDING[out_dtype] * np.abs(want)
        assert np.all(np.abs(got.double().numpy() - want) <= bound)
    assert torch.equal(gemm.matmul_tiles(kind, raw, x), gemm.matmul_vnni(kind, (raw,), x))


@pytest.mark.parametrize("kind", list(vnni_gemm.VNNI_GGML_TYPES))
@pytest.mark.parametrize("n_out,n_in,rows", [(16, 64, 16), (48, 160, 37), (112, 896, 21)])
def test_swiglu_is_silu_gate_times_up(gemm, kind, n_out, n_in, rows):
    (g_raw, g), (u_raw, u) = _weights(kind, n_out, n_in, seed=rows, count=2)
    x = _x(rows, n_in, torch.bfloat16, seed=rows + 1)
    xs = x.double().numpy()
    got = gemm.swiglu_tiles(kind, g_raw, u_raw, x).double().numpy()
    assert_swiglu_close(got, xs, g, u)


def assert_swiglu_close(got, xs, g, u):
    """silu(x g^T) * (x u^T) within the int8 activations' error of each product (|silu'| <=
    1.1, |silu(a)| <= |a|) and one bf16 rounding."""
    gate, up = xs @ g.T, xs @ u.T
    want = gate / (1 + np.exp(-gate)) * up
    eg, eu = error_bound(g, xs), error_bound(u, xs)
    bound = 1.1 * eg * np.abs(up) + eu * np.abs(gate) + 1.1 * eg * eu
    assert np.all(np.abs(got - want) <= bound + 2.0**-8 * np.abs(want) + 1e-6)


def test_shapes_it_does_not_take_are_none(gemm):
    ((raw, _),) = _weights("Q4_0", 48, 64, seed=1)
    assert gemm.matmul_vnni("Q4_0", (raw,), _x(16, 64, torch.bfloat16, 1)) is None  # 48 % 32
    ((raw, _),) = _weights("Q4_0", 32, 64, seed=1)
    assert gemm.matmul_vnni("Q4_0", (raw,), _x(15, 64, torch.bfloat16, 1)) is None  # rows
    assert gemm.matmul_vnni("Q4_0", (raw,), _x(16, 64, torch.float64, 1)) is None  # dtype
    assert gemm.matmul_vnni("Q4_K", (raw,), _x(16, 64, torch.bfloat16, 1)) is None  # kind
    with pytest.raises(
        ValueError, match="Q5_0 weights for 64 inputs must be contiguous rows of 44"
    ):
        gemm.matmul_vnni("Q5_0", (raw,), _x(16, 64, torch.bfloat16, 1))  # Q4_0's bytes
    assert vnni_gemm.vnni_gemm_ok(gemm)


def test_the_amx_tiles_come_first(native):
    if native.amx:
        assert native.vnni_gemm_choice == ("off", "the AMX tiles take these matmuls")
    b = _backend()
    native_probe.probe(b)
    assert b.paths["native VNNI prefill GEMM"] == native.vnni_gemm_choice


def test_the_switch_turns_it_off_and_is_recorded(widest, monkeypatch):
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    monkeypatch.setenv(vnni_gemm.NATIVE_VNNI_GEMM_DISABLE.name, "1")
    b = _backend()
    native = native_probe.probe(b)
    want = ("off", "disabled by TESSERA_NATIVE_VNNI_GEMM_DISABLE=1")
    assert native.vnni_gemm_choice == want and b.paths["native VNNI prefill GEMM"] == want
    ((raw, _),) = _weights("Q8_0", 32, 64, seed=2)
    assert native.matmul_tiles("Q8_0", raw, _x(32, 64, torch.bfloat16, 2)) is None


@pytest.mark.parametrize("path", list(GEMM_PATHS))
def test_each_build_names_its_instructions(path):
    _skip_unless_the_cpu_runs(path)
    native = _probe_without_amx(path)
    build = vnni_gemm.GEMM_BUILDS[native.lib.tsr_vnni_gemm_built()]
    assert build == {"avx512-vnni": "AVX512-VNNI", "avx-vnni": "AVX-VNNI (256-bit)"}.get(
        path, "AVX2 (256-bit)"
    )
    assert native.vnni_gemm_choice == ("on", f"int8 {build} GEMM for 16 rows or more")


def test_the_portable_path_leaves_prefill_to_torch(monkeypatch):
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    monkeypatch.setenv("TESSERA_NATIVE_PATH", "portable")
    native = native_probe.probe(_backend())
    want = ("off", "the portable path leaves these matmuls to torch")
    assert native.vnni_gemm_choice == want and not native.vnni_gemm
    ((raw, _),) = _weights("Q4_0", 32, 64, seed=3)
    assert native.matmul_tiles("Q4_0", raw, _x(32, 64, torch.bfloat16, 3)) is None


def _spy(monkeypatch, calls):
    real = kernels.NativeGemv.matmul_vnni

    def spy(self, kind, ws, x, out_dtype=None, **kw):
        y = real(self, kind, ws, x, out_dtype, **kw)
        if y is not None:  # taken (Q8_0's weight asks at every row count)
            calls.append((kind, len(ws), x.shape[0]))
        return y

    monkeypatch.setattr(kernels.NativeGemv, "matmul_vnni", spy)


@pytest.mark.parametrize("kind", list(vnni_gemm.VNNI_GGML_TYPES))
def test_torch_weights_take_it_for_prefill_without_amx(widest, kind, monkeypatch):
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    # bf16 activations: the backend's fused SwiGLU passes them to the tiles' methods as they are
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "0")
    b = _backend()
    qt = RUNTIME.quant_type_by_name(kind)
    (raw, dense), (raw_up, dense_up) = _weights(kind, 64, 160, seed=4, count=2)
    ws = [
        b.load_weight(RawTensor(f"blk.0.ffn_{n}.weight", qt.ggml_type, (64, 160), r.numpy()), qt)
        for n, r in (("gate", raw), ("up", raw_up))
    ]
    calls = []
    _spy(monkeypatch, calls)
    x = _x(40, 160, torch.bfloat16, seed=5)
    xs = x.double().numpy()
    got = ws[0].matmul(x).double().numpy()
    assert calls == [(kind, 1, 40)]
    want = xs @ dense.T
    assert np.all(np.abs(got - want) <= error_bound(dense, xs) + 2.0**-8 * np.abs(want))
    calls.clear()
    ws[0].matmul(x[:8])  # decode rows: the GEMV
    assert calls == []
    if kind != "Q8_0":  # these weights offer the fused SwiGLU (Q8_0's: the AMX tiles only)
        y = b.gate_up_swiglu(x, *ws)
        assert calls == [(kind, 2, 40)]
        assert_swiglu_close(y.double().numpy(), xs, dense, dense_up)
        assert b.paths["native VNNI prefill GEMM"].path == "on"


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_1"])
def test_a_float32_backend_takes_it_for_prefill(widest, kind, monkeypatch):
    """The default compute dtype of CPUs without fast bf16 (float32): prefill matmuls of
    many rows run the GEMM on the float32 activations and give float32; decode rows stay on
    the GEMV."""
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    monkeypatch.setenv("TESSERA_TORCH_FAST_BF16", "0")
    monkeypatch.delenv("TESSERA_TORCH_DTYPE", raising=False)
    b = _backend(None)
    assert b.dtype == "f32"
    qt = RUNTIME.quant_type_by_name(kind)
    ((raw, dense),) = _weights(kind, 64, 160, seed=10)
    w = b.load_weight(RawTensor("blk.0.ffn_gate.weight", qt.ggml_type, (64, 160), raw.numpy()), qt)
    calls = []
    _spy(monkeypatch, calls)
    x = _x(40, 160, torch.float32, seed=11)
    xs = x.double().numpy()
    y = b.matmul(x, w)
    assert calls == [(kind, 1, 40)] and y.dtype == torch.float32
    want = xs @ dense.T
    assert np.all(np.abs(y.double().numpy() - want) <= error_bound(dense, xs) + 1e-5)
    calls.clear()
    b.matmul(x[:8], w)
    assert calls == []


@pytest.mark.parametrize("kind", list(vnni_gemm.VNNI_GGML_TYPES))
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_float32_activations_go_in_as_they_are(gemm, kind, out_dtype):
    """x read as float32 (quantized to int8 blocks from it, not from a bf16 copy) and y
    written in its own dtype, for a float32 backend and a bf16 one's float32 activations."""
    ((raw, dense),) = _weights(kind, 96, 160, seed=6)
    x = _x(35, 160, torch.float32, seed=7)
    got = gemm.matmul_vnni(kind, (raw,), x, out_dtype, compute_dtype=torch.bfloat16)
    assert torch.equal(got, gemm.matmul_vnni(kind, (raw,), x, out_dtype))
    assert got.dtype == out_dtype
    xs = x.double().numpy()
    want = xs @ dense.astype(np.float64).T
    bound = error_bound(dense, xs) + ROUNDING[out_dtype] * np.abs(want)
    assert np.all(np.abs(got.double().numpy() - want) <= bound)
    # the int8 blocks of x come from its float32 values: a bf16 copy quantizes differently
    via_bf16 = gemm.matmul_vnni(kind, (raw,), x.bfloat16(), out_dtype)
    assert not torch.equal(got, via_bf16)


@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "IQ4_NL"])
def test_float32_activation_backend_takes_it_without_conversions(widest, kind, monkeypatch):
    """A bf16 backend with float32 activations and the AMX tiles off: a prefill matmul and
    the fused SwiGLU run the GEMM on the float32 activations, the matmul's output float32
    and the SwiGLU's bf16 (the down projection's input)."""
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "1")
    b = _backend()
    assert b.act_dtype == torch.float32
    qt = RUNTIME.quant_type_by_name(kind)
    (raw, dense), (raw_up, dense_up) = _weights(kind, 64, 160, seed=8, count=2)
    ws = [
        b.load_weight(RawTensor(f"blk.0.ffn_{n}.weight", qt.ggml_type, (64, 160), r.numpy()), qt)
        for n, r in (("gate", raw), ("up", raw_up))
    ]
    seen = []
    real = kernels.NativeGemv.matmul_vnni

    def spy(self, kind, ws, x, out_dtype=None, compute_dtype=None):
        seen.append((len(ws), x.dtype, out_dtype))
        return real(self, kind, ws, x, out_dtype, compute_dtype)

    monkeypatch.setattr(kernels.NativeGemv, "matmul_vnni", spy)
    x = _x(40, 160, torch.float32, seed=9)
    xs = x.double().numpy()
    y = b.matmul(x, ws[0])
    assert seen == [(1, torch.float32, torch.float32)] and y.dtype == torch.float32
    want = xs @ dense.T
    assert np.all(np.abs(y.double().numpy() - want) <= error_bound(dense, xs) + 1e-5)
    seen.clear()
    s = b.gate_up_swiglu(x, *ws)
    assert seen == [(2, torch.float32, torch.bfloat16)] and s.dtype == torch.bfloat16
    assert_swiglu_close(s.double().numpy(), xs, dense, dense_up)

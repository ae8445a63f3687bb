"""The native Q8_0/Q4_0 decode kernels (tessera.backends.native): against numpy in
float64, their probe and fallbacks, and a model's greedy text against the numpy backend.

Tolerance: the kernels round each activation block of 32 to int8 (scale max|x| / 127), so
an activation is off by at most half a step, max|block| / 254, and a dot product by at most
sum over blocks of that step times sum |w| of the block (``error_bound``), plus float32
rounding. Against the same rounding done in numpy the result must agree to float32 sums
(1e-5 of sum |x_q| |w|). Outputs in bf16/f16 add that format's rounding of the result.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from block_checks import ACTIVATIONS, assert_block_equals_ops
from gguf_checks import int8_activations  # a sibling module

from tessera.backends.native import kernels, library, selftest, vnni_gemm
from tessera.backends.native import probe as native_probe
from tessera.contract.fusion import LLAMA_DECODER
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import RawTensor
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model
from tessera.plugins.quant import q4_0 as quant_q4_0
from tessera.plugins.quant import q8_0 as quant_q8_0

RUNTIME = Runtime()
QMODS = {"Q8_0": quant_q8_0, "Q4_0": quant_q4_0}


def backend(dtype="bf16"):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    RUNTIME.equip(b)
    return b


def weight_bytes(name, n_out, n_in, rng):
    """Random weights with the extreme codes present (Q8_0: -128 and 127; Q4_0: 0 and 15)
    and one all-zero block."""
    raw = QMODS[name].quantize(rng.standard_normal((n_out, n_in)).astype(np.float32))
    ts = QMODS[name].TYPE_SIZE
    blocks = raw.reshape(n_out, -1, ts)
    if name == "Q8_0":
        blocks[0, 0, 2:] = np.arange(-128, 128, 8, dtype=np.int8).view(np.uint8)
    else:
        blocks[0, 0, 2:] = np.arange(16, dtype=np.uint8) * 17  # nibbles 0..15 in both halves
    if n_out > 1:
        blocks[-1, -1] = 0
    return raw


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n_out,n_in,rows", [(1, 32, 1), (7, 64, 2), (37, 96, 3), (130, 256, 7), (64, 896, 1)]
)
def test_kernel_matches_numpy_within_the_int8_activation_bound(
    native, name, threads, n_out, n_in, rows
):
    rng = np.random.default_rng(n_out * 7 + rows)
    raw = weight_bytes(name, n_out, n_in, rng)
    dense = QMODS[name].dequantize(raw).astype(np.float64)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    if n_in > 32:
        x[0, :32] = 0  # an all-zero activation block (scale 0)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native.matmul(name, torch.from_numpy(raw), torch.from_numpy(x)).numpy()
    finally:
        torch.set_num_threads(saved)
    want = x.astype(np.float64) @ dense.T
    bound = selftest.error_bound(dense, x)
    assert got.dtype == np.float32 and got.shape == (rows, n_out)
    assert np.all(np.abs(got - want) <= bound)
    # and exactly what int8 activations give, up to float32 sums
    xq = int8_activations(x)
    scale = np.abs(xq) @ np.abs(dense).T
    assert np.all(np.abs(got - xq @ dense.T) <= 1e-5 * scale + 1e-30)


def test_the_256_bit_path_of_avx_vnni_cpus(native, tmp_path, monkeypatch):
    # the 512-bit kernels serve this CPU; built without AVX512, the AVX-VNNI path runs
    if "avx_vnni" not in library.cpu_flags():
        # Real skip: a 256-bit build needs AVX-VNNI to run; CPUs with AVX512-VNNI only cannot
        # test it (this project's machines have both)
        pytest.skip("this CPU has no AVX-VNNI")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    narrow = library.load(library.build(flags=library.CFLAGS + ("-mno-avx512f",)))
    assert narrow.lib.tsr_native_zmm() == 0 and native.lib.tsr_native_zmm() == 1
    assert selftest.self_test(narrow, threads=2)
    rng = np.random.default_rng(9)
    for name in ("Q8_0", "Q4_0"):
        raw = weight_bytes(name, 19, 128, rng)
        x = torch.from_numpy(rng.standard_normal((5, 128)).astype(np.float32))
        got = narrow.matmul(name, torch.from_numpy(raw), x).numpy()
        want = native.matmul(name, torch.from_numpy(raw), x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_activations_in_and_out(native, dtype):
    rng = np.random.default_rng(5)
    raw = weight_bytes("Q4_0", 21, 128, rng)
    dense = quant_q4_0.dequantize(raw).astype(np.float64)
    x = torch.from_numpy(rng.standard_normal((2, 128)).astype(np.float32)).to(dtype)
    got = native.matmul("Q4_0", torch.from_numpy(raw), x)
    assert got.dtype == dtype
    xs = x.float().numpy()
    want = xs.astype(np.float64) @ dense.T
    bound = selftest.error_bound(dense, xs) + 2.0**-8 * np.abs(want)
    assert np.all(np.abs(got.float().numpy() - want) <= bound)


def test_non_contiguous_activations(native):
    rng = np.random.default_rng(6)
    raw = weight_bytes("Q8_0", 9, 64, rng)
    x = torch.from_numpy(rng.standard_normal((64, 3)).astype(np.float32)).T  # (3, 64) strided
    got = native.matmul("Q8_0", torch.from_numpy(raw), x)
    want = native.matmul("Q8_0", torch.from_numpy(raw), x.contiguous())
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_torch_kernels_use_it_for_decode_and_the_switch_turns_it_off(native, name, monkeypatch):
    rng = np.random.default_rng(8)
    raw_bytes = weight_bytes(name, 40, 128, rng)
    raw = RawTensor("w", RUNTIME.quant_type_by_name(name).ggml_type, (40, 128), raw_bytes)
    qt = RUNTIME.quant_type_by_name(name)
    dense = qt.dequantize_tensor(raw.data, raw.shape).astype(np.float64)
    x = rng.standard_normal((300, 128)).astype(np.float32)
    on = backend()
    w_on = on.load_weight(raw, qt)
    assert w_on.native is not None
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    off = backend()
    w_off = off.load_weight(raw, qt)
    assert w_off.native is None
    assert native_probe.status(off).reason == "disabled by TESSERA_NATIVE_DISABLE=1"
    for rows in (1, 5, 300):  # native on: decode rows native, prefill rows the torch path
        want = x[:rows].astype(np.float64) @ dense.T
        for b, w in ((on, w_on), (off, w_off)):
            got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
            assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    same = on.to_numpy(on.matmul(on.from_numpy(x[:300]), w_on))
    np.testing.assert_array_equal(same, off.to_numpy(off.matmul(off.from_numpy(x[:300]), w_off)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_q4_0_dequantization_is_bit_exact_with_the_torch_path(native, dtype):
    """Prefill dequantizes Q4_0 natively: every value equals numpy's float32 (q - 8) * d
    rounded to the compute dtype by torch (odd row counts, extreme codes, a zero block)."""
    rng = np.random.default_rng(11)
    for n_out, n_in in ((37, 96), (1, 32), (6, 256)):
        raw = torch.from_numpy(weight_bytes("Q4_0", n_out, n_in, rng))
        want = torch.from_numpy(quant_q4_0.dequantize(raw.numpy())).to(dtype)
        assert torch.equal(native.dequantize("Q4_0", raw, dtype), want)
    with pytest.raises(ValueError, match="Q8_0"):
        native.dequantize("Q8_0", raw, dtype)


def test_q4_0_rows_of_a_table_are_the_same_with_and_without_native(native, monkeypatch):
    rng = np.random.default_rng(12)
    qt = RUNTIME.quant_type_by_name("Q4_0")
    raw = RawTensor("t", qt.ggml_type, (50, 64), weight_bytes("Q4_0", 50, 64, rng))
    ids = np.array([0, 7, 49, 7])
    with_native = backend().load_weight(raw, qt)
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    without = backend().load_weight(raw, qt)
    assert with_native.native is not None and without.native is None
    assert torch.equal(with_native.get_rows(ids), without.get_rows(ids))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_q8_0_rows_and_dense_weight_from_the_files_scales(native, dtype, monkeypatch):
    """With the native kernels a Q8_0 weight reads its scales from the file's bytes when it
    needs them (not at load): rows of a table and the dense weight of a prefill matmul are
    those of the torch path, whose scales are made at load, bit for bit."""
    rng = np.random.default_rng(14)
    qt = RUNTIME.quant_type_by_name("Q8_0")
    raw = RawTensor("t", qt.ggml_type, (50, 96), weight_bytes("Q8_0", 50, 96, rng))
    ids = np.array([0, 7, 49, 7])
    with_native = backend(dtype).load_weight(raw, qt)
    assert with_native.native is not None and with_native._scales is None
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    without = backend(dtype).load_weight(raw, qt)
    assert without.native is None and without._scales is not None
    assert torch.equal(with_native.get_rows(ids), without.get_rows(ids))
    assert with_native._scales is None  # the rows read only their own scales
    assert torch.equal(with_native.scales, without.scales)
    dense = with_native._dense(with_native.codes, with_native.scales)
    assert torch.equal(dense, without._dense(without.codes, without.scales))
    want = qt.dequantize_tensor(raw.data, raw.shape)
    np.testing.assert_allclose(dense.float().numpy(), want, rtol=2.0**-7, atol=0)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_rms_norm_runs_natively_and_matches_numpy(native, dtype, threads, monkeypatch):
    """The native RMSNorm (float32 statistics; rows split over the threads from 65536
    values), within one rounding of the dtype of numpy's on the same inputs; the switch
    gives torch's kernel, which agrees too."""
    b = backend(dtype)
    monkeypatch.setattr(native, "_threads", lambda: threads)  # the count the C side gets
    ref = RUNTIME.create_backend("numpy")
    rng = np.random.default_rng(13)
    w = rng.uniform(0.5, 1.5, 900).astype(np.float32)
    calls = []
    monkeypatch.setattr(type(native), "rms_norm", _spy(type(native).rms_norm, calls))
    step = 2.0**-8 if dtype == "bf16" else 2.0**-11
    for rows in (1, 3, 100, 513):
        x = rng.standard_normal((rows, 900)).astype(np.float32) * 3
        x[-1] *= 100  # a row of another scale: each row has its own statistics
        xr, wr = (b.to_numpy(b.from_numpy(a)) for a in (x, w))
        for weight in (b.from_numpy(w), None):
            got = b.to_numpy(b.rms_norm(b.from_numpy(x), weight, 1e-6))
            want = ref.rms_norm(xr, None if weight is None else wr, 1e-6)
            assert np.all(np.abs(got - want) <= step * np.abs(want) + 1e-6)
    ours = [s for s in calls if s[-1] == 900]  # (the probe's self-test adds its own calls)
    assert len(ours) == 8
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    off = backend(dtype)
    got = off.to_numpy(off.rms_norm(off.from_numpy(x), None, 1e-6))
    assert np.all(np.abs(got - want) <= step * np.abs(want) + 1e-6)
    assert len([s for s in calls if s[-1] == 900]) == 8


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("n_rot", [64, 32])
def test_decode_rope_runs_natively_and_equals_the_torch_ops(
    native, dtype, neox, n_rot, monkeypatch
):
    """Bit for bit the torch path's result (each product and sum rounded to the dtype), at
    large positions, with part of each head unrotated when n_rot < head_dim."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    positions = np.array([0, 7, 100_000])
    calls = []
    monkeypatch.setattr(type(native), "rope", _spy(type(native).rope, calls))
    on = backend(dtype)
    got = on.rope(on.from_numpy(x), positions, n_rot, 10000.0, neox)
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    off = backend(dtype)
    want = off.rope(off.from_numpy(x), positions, n_rot, 10000.0, neox)
    assert [s for s in calls if s[-1] == 64] == [(3, 4, 64)]  # on used it; off did not
    assert torch.equal(got, want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d,dv,n_rows", [(64, 64, 300), (12, 9, 21)])
def test_attention_rows_kernel_matches_float64(native, threads, dtype, d, dv, n_rows):
    """Two sequences (slices) with padding, a causal-style mask, GQA 7:1 and 1:1 head blocks,
    head sizes off the vector width; vs numpy in float64 within the dtype's rounding."""
    rng = np.random.default_rng(d + n_rows)
    n_cells, h, h_kv = n_rows + 8, 14, 2
    rows = np.stack([rng.permutation(n_cells)[:n_rows], rng.permutation(n_cells)[:n_rows]])
    rows[1, -5:] = -1  # padding
    q_rows = np.array([[0, 2], [1, -1]])
    allowed = rng.random((2, 2, n_rows)) < 0.8
    q = torch.from_numpy(rng.standard_normal((3, h, d)).astype(np.float32) * 2).to(dtype)
    k = torch.from_numpy(rng.standard_normal((n_cells, h_kv, d)).astype(np.float32)).to(dtype)
    v = torch.from_numpy(rng.standard_normal((n_cells, h_kv, dv)).astype(np.float32)).to(dtype)
    qn, kn, vn = (a.float().numpy() for a in (q, k, v))
    step = {torch.float32: 1e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for mask in (allowed, None):
            lists = kernels.RowLists(rows, q_rows, mask)
            got = native.attention_rows(q, k, v, lists, 0.2)
            assert got.dtype == dtype and got.shape == (3, h * dv)
            want = selftest.attention_reference(qn, kn, vn, rows, q_rows, mask, 0.2)
            # float32 scores: relative 1e-5 of the largest |v|, plus the output's rounding
            bound = step * np.abs(want) + 2e-5 * np.abs(vn).max()
            assert np.all(np.abs(got.float().numpy() - want) <= bound)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_decode_attention_runs_natively_and_agrees_with_sdpa(native, dtype, monkeypatch):
    """Decode over a real cache's row lists: the native kernel (its call seen) against the
    SDPA path it replaces (native off), within two roundings of the dtype; a prefill-sized
    ubatch keeps SDPA."""
    from tessera.backends.torch import attention as torch_attention
    from tessera.engine.kv_cache import KVCache

    rng = np.random.default_rng(15)
    n_cells, h, h_kv, d = 200, 8, 2, 64
    cache = KVCache(None, [None], n_cells, 2)
    for seq, n in ((0, 150), (1, 40)):
        cache.commit(cache.find_slot(n), np.arange(n), np.full(n, seq))
    k = rng.standard_normal((n_cells, h_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_cells, h_kv, d)).astype(np.float32)
    big = torch_attention.NATIVE_ATTENTION_QUERIES + 1
    # decode: seq 0's next token; prefill-sized: seq 1's last `big` tokens
    ubatches = {
        1: (np.array([149]), np.array([0])),
        big: (np.arange(40 - big, 40), np.ones(big, dtype=int)),
    }
    qs = {n: rng.standard_normal((n, h, d)).astype(np.float32) for n in ubatches}
    calls = []
    monkeypatch.setattr(type(native), "attention_rows", _spy(type(native).attention_rows, calls))
    results = {}
    for label in ("on", "off"):
        if label == "off":
            monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
        b = backend(dtype)
        kc, vc = b.from_numpy(k), b.from_numpy(v)
        for n, (positions, seqs) in ubatches.items():
            rows = cache.rows(positions, seqs, cache.n_kv())
            results[label, n] = b.attention_rows(b.from_numpy(qs[n]), kc, vc, rows, 0.125)
    assert [c for c in calls if c[-1] == d] == [(1, h, d)]  # decode only, native on only
    step = 2.0**-7 if dtype == "bf16" else 2.0**-10
    for n in ubatches:
        on, off = results["on", n].float(), results["off", n].float()
        assert torch.all((on - off).abs() <= step * off.abs() + 2e-3)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_n_kernel_matches_numpy_with_biases(native, name, threads):
    rng = np.random.default_rng(16)
    sizes = (37, 5, 8)
    raws = tuple(torch.from_numpy(weight_bytes(name, n, 96, rng)) for n in sizes)
    dense = np.concatenate([QMODS[name].dequantize(r.numpy()) for r in raws]).astype(np.float64)
    bias = rng.standard_normal(5).astype(np.float32)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 3, 6):
            x = rng.standard_normal((rows, 96)).astype(np.float32)
            biases = (None, torch.from_numpy(bias), None)
            got = native.matmul_n(name, raws, torch.from_numpy(x), biases).numpy()
            want = x.astype(np.float64) @ dense.T
            want[:, 37:42] += bias
            assert got.shape == (rows, 50)
            assert np.all(np.abs(got - want) <= selftest.error_bound(dense, x))
            # each block equals the single-weight kernel's output (plus its bias)
            alone = native.matmul(name, raws[1], torch.from_numpy(x)).numpy() + bias
            np.testing.assert_allclose(got[:, 37:42], alone, rtol=1e-6, atol=1e-6)
    finally:
        torch.set_num_threads(saved)


def test_backend_matmul_n_batches_native_weights_only(native, monkeypatch):
    """The torch backend's matmul_n makes one native call for same-type native weights at
    decode rows, and falls back per weight for mixed types, dense weights, prefill rows
    and with the switch off; every path agrees with matmul + add."""
    rng = np.random.default_rng(17)

    def raw(name, n_out):
        qt = RUNTIME.quant_type_by_name(name)
        return RawTensor("w", qt.ggml_type, (n_out, 64), weight_bytes(name, n_out, 64, rng)), qt

    calls = []
    monkeypatch.setattr(type(native), "matmul_n", _spy(type(native).matmul_n, calls))
    bias = rng.standard_normal(16).astype(np.float32)
    b = backend()
    q4 = [b.load_weight(*raw("Q4_0", n)) for n in (24, 16)]
    mixed = [q4[0], b.load_weight(*raw("Q8_0", 16))]
    dense = [q4[0], b.from_numpy(rng.standard_normal((16, 64)).astype(np.float32))]
    for weights, rows, expect_native in (
        (q4, 1, True), (q4, 200, False), (mixed, 1, False), (dense, 1, False)
    ):  # fmt: skip
        x = b.from_numpy(rng.standard_normal((rows, 64)).astype(np.float32))
        before = len(calls)
        ys = b.matmul_n(x, weights, [None, b.from_numpy(bias)])
        assert (len(calls) > before) == expect_native
        want = [b.matmul(x, weights[0]), b.add(b.matmul(x, weights[1]), b.from_numpy(bias))]
        for y, w in zip(ys, want, strict=True):
            scale = w.float().abs().max()
            assert y.shape == w.shape and (y.float() - w.float()).abs().max() <= 1e-2 * scale
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    off = backend()
    weights = [off.load_weight(*raw("Q4_0", n)) for n in (24, 16)]
    before = len(calls)
    off.matmul_n(off.from_numpy(rng.standard_normal((1, 64)).astype(np.float32)), weights)
    assert len(calls) == before


def _spy(fn, calls):
    def spy(*args, **kwargs):
        calls.append(getattr(args[1], "shape", args[1]))  # a tensor's shape, or matmul_n's kind
        return fn(*args, **kwargs)

    return spy


def test_f32_compute_keeps_the_exact_paths(monkeypatch):
    monkeypatch.delenv("TESSERA_NATIVE_DISABLE", raising=False)
    b = backend("f32")
    assert native_probe.probe(b) is None
    assert "f32" in native_probe.status(b).reason


VNNI_CPU = {"avx2", "fma", "f16c", "avx512_vnni", "avx512vl"}


def test_no_compiler_falls_back_to_the_torch_path(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "cpu_flags", lambda: VNNI_CPU)  # get to the compiler
    monkeypatch.delenv("TESSERA_NATIVE_DISABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no library built before
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    b = backend()
    assert native_probe.probe(b) is None
    assert native_probe.status(b).reason.startswith("build or load failed")
    raw, qt = quantized_raw("Q4_0")
    w = b.load_weight(raw, qt)
    assert w.native is None and b.placements[-1][1] == "kernel Q4_0"
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    want = x @ qt.dequantize_tensor(raw.data, raw.shape).T
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    assert list(tmp_path.rglob("*.so")) == []


def test_failing_compiler_and_missing_cpu_flags_fall_back(tmp_path, monkeypatch):
    cc = tmp_path / "cc"
    cc.write_text('#!/bin/sh\n[ "$1" = --version ] && echo fake-cc 1 && exit 0\nexit 1\n')
    cc.chmod(0o755)
    monkeypatch.setattr(library, "cpu_flags", lambda: VNNI_CPU)
    monkeypatch.delenv("TESSERA_NATIVE_DISABLE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", str(cc))
    b = backend()
    assert native_probe.probe(b) is None and "failed" in native_probe.status(b).reason
    assert not [p for p in (tmp_path / "tessera" / "native").iterdir()]  # no temp file left
    monkeypatch.setattr(library, "cpu_flags", lambda: {"avx2", "fma"})
    b = backend()
    assert native_probe.probe(b) is None and "F16C" in native_probe.status(b).reason


def test_a_library_that_dies_in_the_child_process_falls_back(native, tmp_path, monkeypatch):
    # as a build with instructions the CPU refuses would: SIGILL in the child, not here
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(library, "_SMOKE", "import os; os.kill(os.getpid(), 4)")
    b = backend()
    assert native_probe.probe(b) is None
    assert "failed in a test process (exit -4)" in native_probe.status(b).reason
    assert not list(tmp_path.rglob("*.ok"))


def test_build_is_cached_and_written_whole(tmp_path, monkeypatch, native):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = library.build()
    assert first.parent == tmp_path / "tessera" / "native" and first.suffix == ".so"
    mtime = first.stat().st_mtime_ns
    assert library.build() == first and first.stat().st_mtime_ns == mtime
    assert [p.name for p in first.parent.iterdir()] == [first.name]
    assert selftest.self_test(library.load(first))


def quantized_raw(name, shape=(24, 64)):
    qt = RUNTIME.quant_type_by_name(name)
    values = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return RawTensor("blk.0.ffn_up.weight", qt.ggml_type, shape, qt.quantize_tensor(values)), qt


# -- a model: the trained default model quantized, torch bf16 + native vs numpy ----------


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def quantized_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("native") / f"default-{request.param}.gguf"
    quantize_model(default_model_path(), path, request.param, RUNTIME)
    return path


def test_model_decode_matches_the_numpy_backend(native, quantized_model, monkeypatch):
    calls = []
    original = kernels.NativeGemv.matmul

    def counted(self, kind, w, x):
        calls.append(kind)
        return original(self, kind, w, x)

    monkeypatch.setattr(kernels.NativeGemv, "matmul", counted)
    ref = load_model(quantized_model, RUNTIME, "numpy")
    fast = load_model(quantized_model, RUNTIME, "torch", dtype="bf16")
    prompt = ref.tokenizer.encode("The for statement")  # a code model: clear top tokens

    def greedy(model):
        ctx = Context(model, ContextParams(n_ctx=128))
        return list(generate(ctx, prompt, 16, Sampler(SamplerParams(temperature=0))))

    def decode_steps(model, tokens):
        """Each step's logits, decoding the reference's tokens one at a time."""
        ctx = Context(model, ContextParams(n_ctx=128))
        out = [ctx.decode(Batch.for_sequence(prompt))[-1]]
        for i, token in enumerate(tokens[:-1]):
            out.append(ctx.decode(Batch.for_sequence([token], start_pos=len(prompt) + i))[-1])
        return out

    tokens = greedy(ref)
    # The same greedy choice at every step, but where the reference's top two logits are
    # closer than the fast path's distance from it there (a near-tie either side of which
    # is within the kernels' rounding); at most one such step.
    ties = 0
    for want, got in zip(decode_steps(ref, tokens), decode_steps(fast, tokens), strict=True):
        if got.argmax() != want.argmax():
            top2 = np.sort(want)[-2:]
            assert top2[1] - top2[0] <= 2 * np.abs(got - want).max()
            ties += 1
    assert ties <= 1
    assert len(calls) > 16  # decode went through the native kernels
    # logits of one decode step after the prompt and the generated text
    logits = []
    for model in (ref, fast):
        ctx = Context(model, ContextParams(n_ctx=128))
        ctx.decode(Batch.for_sequence(prompt + tokens[:-1]))
        batch = Batch.for_sequence([tokens[-1]], start_pos=len(prompt) + len(tokens) - 1)
        logits.append(ctx.decode(batch)[-1])
    assert np.abs(logits[1] - logits[0]).max() <= 0.05 * np.abs(logits[0]).max()


@pytest.mark.parametrize("f32_acts", ACTIVATIONS)
def test_decoder_block_equals_the_op_by_op_path(native, quantized_model, f32_acts, monkeypatch):
    """Decode through the fused native block: the same logits, bit for bit, as the same
    kernels called op by op (the block runs them in the same order with the same
    roundings); the switch turns it off; prefill never takes it."""
    calls = []
    original = kernels.NativeGemv.block_decode

    def counted(self, block, step, x):
        calls.append(x.shape)
        return original(self, block, step, x)

    monkeypatch.setattr(kernels.NativeGemv, "block_decode", counted)
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", f32_acts)

    def decode_logits(switch):
        monkeypatch.setenv("TESSERA_DECODER_BLOCK_DISABLE", switch)  # read when it loads
        model = load_model(quantized_model, RUNTIME, "torch", dtype="bf16")
        prompt = model.tokenizer.encode("def main():")
        ctx = Context(model, ContextParams(n_ctx=64))
        out, token = [], int(ctx.decode(Batch.for_sequence(prompt))[-1].argmax())
        for i in range(6):
            step = ctx.decode(Batch.for_sequence([token], start_pos=len(prompt) + i))[-1]
            out.append(step)
            token = int(step.argmax())
        monkeypatch.delenv("TESSERA_DECODER_BLOCK_DISABLE")
        return np.array(out), model.config

    fused, config = decode_logits("0")
    assert calls == [(1, config.n_embd)] * (6 * config.n_layer)  # every decode layer, no prefill
    op_by_op, _ = decode_logits("1")
    assert len(calls) == 6 * config.n_layer  # the model loaded with the switch never used it
    assert_block_equals_ops(fused, op_by_op, f32_acts)


def test_decoder_block_declines_weights_without_a_native_kernel(native, tmp_path, monkeypatch):
    """An F16 model with the dense GEMV switched off: the block is declined (None, nothing
    written) and the ops run."""
    from tessera.engine.kv_cache import KVCache

    monkeypatch.setenv("TESSERA_NATIVE_DENSE_DISABLE", "1")
    path = tmp_path / "default-f16.gguf"
    quantize_model(default_model_path(), path, "F16", RUNTIME)
    model = load_model(path, RUNTIME, "torch", dtype="bf16")
    block = model.graph._decoder_blocks()[0]
    b = model.backend
    cache = KVCache(None, [None], 8, 1)
    cache.commit(np.array([0]), np.array([0]), np.array([0]))
    k = b.zeros((8, block.n_head_kv, block.head_dim))
    v = b.zeros((8, block.n_head_kv, block.head_dim))
    x = b.from_numpy(np.ones((1, model.config.n_embd), dtype=np.float32))
    rows = cache.rows(np.array([0]), np.array([0]), cache.n_kv())
    fusion = b.fusion(LLAMA_DECODER)  # offered (native kernels), declined for these weights
    assert fusion.run(b, x, block, k, v, 0, rows, np.array([0])) is None
    assert not k.any() and not v.any()


def test_q4_0_int4_layout_is_made_only_when_a_matmul_needs_it(native):
    """With the native kernel, decode and dense prefill never pack torch's int4 layout (no
    second copy of the weight in RAM); a 64..95-row matmul packs it on first use."""
    rng = np.random.default_rng(19)
    qt = RUNTIME.quant_type_by_name("Q4_0")
    raw = RawTensor("w", qt.ggml_type, (40, 128), weight_bytes("Q4_0", 40, 128, rng))
    dense = qt.dequantize_tensor(raw.data, raw.shape).astype(np.float64)
    b = backend()
    w = b.load_weight(raw, qt)
    for rows in (1, 200, 70):
        if rows == 70:
            assert w.packed is None  # decode and prefill went without it
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        got = b.to_numpy(b.matmul(b.from_numpy(x), w))
        want = x.astype(np.float64) @ dense.T
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    assert w.packed is not None


# -- the AMX prefill matmul (native_amx.c) ----------------------------------------------
#
# The kernel dequantizes each block to bf16 (the values the dequantize-then-matmul path
# uses, so numpy multiplies those same bf16 weights), multiplies bf16 activations exactly
# and sums in float32; the only other rounding is the bf16 output: at most 2^-8 of the
# result, plus float32 sums (1e-5 of sum |x| |w|).


@pytest.fixture(scope="module")
def tiles(native):
    if not native.amx:
        if {"amx_tile", "amx_bf16", "avx512_bf16"} <= library.cpu_flags():
            # the kernel can run here, so a build without it or a failed self-test is a bug
            pytest.fail(f"AMX matmuls off on a CPU with AMX: {native_probe.status(backend())}")
        # Real skip: this CPU has no AMX tiles (the VNNI and torch paths are tested elsewhere;
        # the project's machines have AMX)
        pytest.skip("this CPU has no AMX-BF16")
    return native


def tiles_reference(name, raw, x):
    """numpy float64 product with the weight dequantized and rounded to bf16, and sum |x||w|."""
    dense = torch.from_numpy(QMODS[name].dequantize(raw)).bfloat16().double().numpy()
    xs = x.double().numpy()
    return xs @ dense.T, np.abs(xs) @ np.abs(dense).T


def assert_tiles_close(got, want, exact):
    err = np.abs(got.double().numpy() - want)
    assert np.all(err <= 2.0**-8 * np.abs(want) + 1e-5 * exact + 1e-30), err.max()


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n_out, n_in, rows",
    # a ragged last row block, exactly one block, inputs from 32 to 4864, several strips
    [(32, 32, 16), (64, 96, 33), (96, 256, 70), (160, 896, 64), (64, 4864, 17)],
)
def test_tiles_match_numpy(tiles, name, threads, n_out, n_in, rows, monkeypatch):
    monkeypatch.setattr(tiles, "_threads", lambda: threads)
    rng = np.random.default_rng(n_out + n_in + rows)
    raw = weight_bytes(name, n_out, n_in, rng)
    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32) * 3).bfloat16()
    got = tiles.matmul_tiles(name, torch.from_numpy(raw), x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n_out)
    assert_tiles_close(got, *tiles_reference(name, raw, x))


def test_tiles_take_only_what_they_serve(tiles):
    rng = np.random.default_rng(3)
    raw = torch.from_numpy(weight_bytes("Q4_0", 48, 64, rng))  # 48 rows: not a multiple of 32
    x = torch.randn(20, 64).bfloat16()
    assert tiles.matmul_tiles("Q4_0", raw, x) is None
    raw = torch.from_numpy(weight_bytes("Q4_0", 64, 64, rng))
    assert tiles.matmul_tiles("Q4_0", raw, x[: kernels.AMX_MIN_ROWS - 1]) is None
    assert tiles.matmul_tiles("Q4_0", raw, x.half()) is None
    assert tiles.matmul_tiles("Q4_0", raw, x.T.contiguous().T) is not None  # made contiguous


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_weights_send_each_row_count_to_its_kernel(tiles, name, monkeypatch):
    """Below AMX_MIN_ROWS the VNNI kernel (and matmul_n may batch the weight); from there the
    tiles (matmul_n must not batch it); with the AMX and VNNI GEMM switches, the VNNI kernel
    and then torch's dense path, all within the tolerance of the same numpy product."""
    qt = RUNTIME.quant_type_by_name(name)
    rng = np.random.default_rng(4)
    raw_bytes = weight_bytes(name, 64, 128, rng)
    raw = RawTensor("w", qt.ggml_type, (64, 128), raw_bytes)
    calls = []  # the kernels that gave a result

    def spy(method):
        real = getattr(kernels.NativeGemv, method)

        def call(self, *args):
            y = real(self, *args)
            if y is not None:
                calls.append(method)
            return y

        monkeypatch.setattr(kernels.NativeGemv, method, call)

    spy("matmul")
    spy("matmul_tiles")
    weight = backend().load_weight(raw, qt)
    for rows, kernel in ((5, "matmul"), (16, "matmul_tiles"), (100, "matmul_tiles")):
        calls.clear()
        x = torch.from_numpy(rng.standard_normal((rows, 128)).astype(np.float32)).bfloat16()
        y = weight.matmul(x)
        assert calls[-1] == kernel
        assert (weight.native_gemv(rows) is None) == (kernel == "matmul_tiles")
        if kernel == "matmul_tiles":
            assert_tiles_close(y, *tiles_reference(name, raw_bytes, x))
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")
    monkeypatch.setenv(vnni_gemm.NATIVE_VNNI_GEMM_DISABLE.name, "1")  # its own tests
    b = backend()
    assert not native_probe.probe(b).amx
    off = b.load_weight(raw, qt)
    calls.clear()
    x = torch.from_numpy(rng.standard_normal((100, 128)).astype(np.float32)).bfloat16()
    y = off.matmul(x)
    assert calls == []  # torch's dense path
    assert off.native_gemv(16) is not None  # decode's kernel takes 16 rows again
    # torch's dense path (Q8_0 there rounds the scale to bf16 before the product: each
    # weight within 2^-8 of its value)
    want, exact = tiles_reference(name, raw_bytes, x)
    err = np.abs(y.double().numpy() - want)
    assert np.all(err <= 2.0**-8 * np.abs(want) + 2.0**-8 * exact)


def test_a_build_without_amx_says_so_and_keeps_the_other_kernels(tiles, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    plain = library.load(library.build(flags=library.CFLAGS + ("-mno-amx-tile",)))
    assert plain.lib.tsr_native_amx() == 0 and not plain.amx
    x = torch.randn(40, 64).bfloat16()
    raw = torch.from_numpy(weight_bytes("Q8_0", 64, 64, np.random.default_rng(6)))
    # the int8 VNNI GEMM takes the tiles' place where the build has AVX512-VNNI
    assert plain.vnni_gemm == ("avx512_vnni" in library.cpu_flags())
    assert (plain.matmul_tiles("Q8_0", raw, x) is None) != plain.vnni_gemm
    assert selftest.self_test(plain)


def test_the_probe_reports_amx(tiles):
    assert "AMX matmuls" in native_probe.status(backend()).reason
    assert selftest.tiles_ok(tiles)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_ff, n_in, rows", [(16, 32, 16), (48, 96, 33), (80, 896, 70)])
def test_swiglu_tiles_match_numpy(tiles, name, threads, n_ff, n_in, rows, monkeypatch):
    """silu(x Wg^T) * (x Wu^T) from float32 gate and up values, rounded once to bf16."""
    monkeypatch.setattr(tiles, "_threads", lambda: threads)
    rng = np.random.default_rng(n_ff + n_in + rows)
    raw_g, raw_u = (weight_bytes(name, n_ff, n_in, rng) for _ in range(2))
    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32)).bfloat16()
    got = tiles.swiglu_tiles(name, torch.from_numpy(raw_g), torch.from_numpy(raw_u), x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n_ff)
    (g, exact_g), (u, exact_u) = (tiles_reference(name, r, x) for r in (raw_g, raw_u))
    silu = g / (1 + np.exp(-g))
    want = silu * u
    # float32 sums move g and u by 1e-5 of sum |x||w|; silu' <= 1.1; then bf16's rounding
    sums = 1e-5 * (1.1 * exact_g * (np.abs(u) + exact_u) + (np.abs(silu) + exact_g) * exact_u)
    err = np.abs(got.double().numpy() - want)
    assert np.all(err <= 2.0**-8 * np.abs(want) + sums + 1e-30), err.max()
    assert np.abs(want).max() > 1  # the values span more than the rounding


def test_gate_up_swiglu_takes_the_tiles_from_16_rows(tiles, monkeypatch):
    # the bf16 kernels' dispatch (float32 activations take amx_f32's: test_native_amx_f32.py)
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "0")
    qt = RUNTIME.quant_type_by_name("Q4_0")
    rng = np.random.default_rng(8)
    b = backend()
    gate, up = (
        b.load_weight(RawTensor(n, qt.ggml_type, (64, 128), weight_bytes("Q4_0", 64, 128, rng)), qt)
        for n in ("gate", "up")
    )
    calls = []
    real = kernels.NativeGemv.swiglu_tiles
    monkeypatch.setattr(
        kernels.NativeGemv, "swiglu_tiles", lambda *a: calls.append(a[-1].shape) or real(*a)
    )
    for rows in (5, 16, 40):
        x = b.from_numpy(rng.standard_normal((rows, 128)).astype(np.float32))
        fused = b.gate_up_swiglu(x, gate, up)
        g, u = b.matmul_n(x, [gate, up])
        ops = b.to_numpy(b.swiglu(g, u))
        # the op path rounds gate, up and silu to bf16 first: within a few bf16 steps
        np.testing.assert_allclose(b.to_numpy(fused), ops, rtol=2**-6, atol=2**-6)
    assert [r for r, _ in calls] == [16, 40]

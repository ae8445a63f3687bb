"""The native dense 16-bit GEMV (F16/BF16 weights, ``native_dense_gemv.c``): against numpy
in float64 on every CPU path (forced by compiler flags), and its use by the torch backend's
plain weights, the BF16/F16 files' in-place tensors and the fused decoder block.

Tolerance (:func:`~tessera.backends.native.dense_selftest.dense_bound`): the products are
exact, so only float32 sums and the output's one rounding to its dtype differ from float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from block_checks import ACTIVATIONS, assert_block_equals_ops

from tessera.backends.native import dense_gemv, dense_selftest, kernels, library
from tessera.backends.torch.dense_native import dense_native
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import RawTensor
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model

RUNTIME = Runtime()
W_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}


def backend(dtype="bf16"):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    RUNTIME.equip(b)
    return b


def check(native, kind, n_out, n_in, rows, x_dtype, seed=0):
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.standard_normal((n_out, n_in)).astype(np.float32) * 2)
    w = w.to(W_DTYPES[kind])
    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32)).to(x_dtype)
    got = native.gemv_dense(kind, (w,), x)
    assert got.dtype == x_dtype and got.shape == (rows, n_out)
    xs, ws = x.double().numpy(), w.double().numpy()
    want = xs @ ws.T
    bound = dense_selftest.dense_bound(xs, ws, want, str(x_dtype).split(".")[1])
    assert np.all(np.abs(got.double().numpy() - want) <= bound)


@pytest.mark.parametrize("kind", ["F16", "BF16"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    # one row; ragged row groups; columns off the 16- and 32-value vectors; every row count
    # of a pass and beyond; a wide input
    "n_out,n_in,rows",
    [(1, 16, 1), (7, 40, 2), (37, 96, 3), (130, 33, 4), (9, 256, 7), (64, 4864, 1)],
)
def test_gemv_matches_float64(native, kind, x_dtype, threads, n_out, n_in, rows, monkeypatch):
    monkeypatch.setattr(native, "_threads", lambda: threads)
    check(native, kind, n_out, n_in, rows, x_dtype, seed=n_out + rows)


def test_several_weights_and_biases_in_one_call(native):
    """Q/K/V-shaped weights side by side, a bias on one: the self-test's check, and each
    block equal to the one-weight call plus its bias before the one rounding."""
    assert dense_selftest.dense_ok(native, seed=3)
    rng = np.random.default_rng(4)
    ws = tuple(
        torch.from_numpy(rng.standard_normal((n, 64)).astype(np.float32)).bfloat16()
        for n in (8, 4, 4)
    )
    bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).bfloat16()
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).bfloat16()
    y = native.gemv_dense("BF16", ws, x, (None, bias, None))
    assert torch.equal(y[:, :8], native.gemv_dense("BF16", ws[:1], x))
    with_bias = native.gemv_dense("BF16", ws[1:2], x.float()) + bias.float()
    assert torch.equal(y[:, 8:12], with_bias.bfloat16())


def test_no_rows_give_an_empty_output(native):
    """A matmul of zero rows (an expert no token chose) is an empty result, not an error."""
    ws = (torch.ones((6, 64), dtype=torch.bfloat16), torch.ones((2, 64), dtype=torch.bfloat16))
    y = native.gemv_dense("BF16", ws, torch.empty((0, 64), dtype=torch.bfloat16))
    assert y.shape == (0, 8) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 5, 31, 65536 * 3 + 17])
def test_f16_to_bf16_is_torchs_cast(native, threads, n, monkeypatch):
    """Lengths off the vector widths and across the threads' 64 Ki-value runs; the
    self-test covers every bit pattern (NaNs: a NaN of the same sign)."""
    monkeypatch.setattr(native, "_threads", lambda: threads)
    values = (torch.randn(n) * 1000).half()
    got = native.f16_to_bf16(values)
    assert got.dtype == torch.bfloat16 and got.shape == values.shape
    assert torch.equal(got.view(torch.int16), values.to(torch.bfloat16).view(torch.int16))
    assert dense_selftest.convert_ok(native)


def test_file_bytes_are_read_as_the_16_bit_values(native):
    """uint8 rows of the file (``(n_out, 2 n_in)``) give the same result as the tensor of
    their values."""
    w = torch.randn(12, 48).half()
    x = torch.randn(2, 48).bfloat16()
    raw = w.view(torch.uint8)
    assert raw.shape == (12, 96)
    assert torch.equal(native.matmul("F16", raw, x), native.gemv_dense("F16", (w,), x))


@pytest.mark.parametrize(
    "flags,needs,path",
    [((), "avx512_bf16", 2), (("-mno-avx512bf16",), "avx512f", 1), (("-mno-avx512f",), "avx2", 0)],
    ids=["avx512-bf16", "avx512f", "avx2-f16c"],
)
def test_each_cpu_path_forced_by_its_flags(native, tmp_path, monkeypatch, flags, needs, path):
    """The library built for each path says which it runs and passes the dense self-test
    and the float64 checks (the portable path is torch's matmul: the switch's test)."""
    if needs not in library.cpu_flags():
        # Real skip: a build for this path runs only on a CPU with its instructions
        pytest.skip(f"this CPU has no {needs}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lib = library.load(library.build(flags=library.CFLAGS + flags))
    assert lib.lib.tsr_dense_path() == path
    assert lib.dense_path() == dense_gemv.DENSE_PATHS[path]
    assert dense_selftest.dense_ok(lib, seed=5)
    assert dense_selftest.convert_ok(lib)
    for kind in W_DTYPES:
        for x_dtype in (torch.float32, torch.bfloat16):
            check(lib, kind, 37, 200, 5, x_dtype, seed=6)


def _spy(monkeypatch, calls, *backends):
    """Record the GEMV's calls from here on (the backends' probes, whose self-test calls it
    too, are run first)."""
    for b in backends:
        dense_native(b)
    real = kernels.NativeGemv.gemv_dense

    def spy(self, kind, ws, x, biases=None):
        calls.append((kind, x.shape[0]))
        return real(self, kind, ws, x, biases)

    monkeypatch.setattr(kernels.NativeGemv, "gemv_dense", spy)


def raw_tensor(kind, n_out=24, n_in=64, seed=1):
    qt = RUNTIME.quant_type_by_name(kind)
    values = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    raw = RawTensor("blk.0.ffn_up.weight", qt.ggml_type, (n_out, n_in), qt.quantize_tensor(values))
    return raw, qt, qt.dequantize_tensor(raw.data, raw.shape).astype(np.float64)


def test_a_bf16_file_in_bf16_is_its_bytes_and_decodes_natively(native, monkeypatch):
    """The BF16 weight is a view of the file's bytes (no copy at load); matmuls below
    NATIVE_DENSE_MAX_ROWS rows take the GEMV, from there torch's matmul; both match numpy."""
    raw, qt, dense = raw_tensor("BF16")
    b = backend()
    w = b.load_weight(raw, qt)
    assert isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 and w.shape == (24, 64)
    assert w.data_ptr() == raw.data.ctypes.data  # the file's memory itself
    assert b.placements[-1][1] == "kernel BF16"
    calls = []
    _spy(monkeypatch, calls, b)
    top = dense_gemv.NATIVE_DENSE_MAX_ROWS
    x = np.random.default_rng(2).standard_normal((top, 64)).astype(np.float32)
    for rows in (1, top - 1, top):
        calls.clear()
        got = b.matmul(b.from_numpy(x[:rows]), w)
        assert calls == ([("BF16", rows)] if rows < top else [])
        xs = b.from_numpy(x[:rows]).double().numpy()
        want = xs @ dense.T
        assert np.abs(got.double().numpy() - want).max() <= 2.0**-7 * np.abs(want).max()
    assert b.paths["native dense matmuls"].path == "native"


def test_f16_files_in_bf16_decode_on_the_bf16_copy(native, monkeypatch):
    """An F16 weight in a bf16 backend that does not keep it in place (no AMX tiles, or
    the switch) is converted at load (natively, by the F16 kernel) and its decode matmuls
    take the GEMV on that copy; in an f16 backend it stays the file's bytes."""
    monkeypatch.setenv("TESSERA_F16_IN_PLACE_DISABLE", "1")
    raw, qt, _ = raw_tensor("F16")
    b = backend()
    w = b.load_weight(raw, qt)
    assert w.dtype == torch.bfloat16 and b.placements[-1][1] == "kernel F16"
    assert b.paths["F16 weights to bf16"].path == "native"
    assert w.data_ptr() != raw.data.ctypes.data
    h = backend("f16")
    wh = h.load_weight(raw, qt)
    calls = []
    _spy(monkeypatch, calls, b, h)
    b.matmul(b.from_numpy(np.ones((1, 64), np.float32)), w)
    assert calls == [("BF16", 1)]
    assert wh.dtype == torch.float16 and wh.data_ptr() == raw.data.ctypes.data
    calls.clear()
    h.matmul(h.from_numpy(np.ones((2, 64), np.float32)), wh)
    assert calls == [("F16", 2)]


def test_the_switch_keeps_torch_matmuls(native, monkeypatch):
    monkeypatch.setenv(dense_gemv.NATIVE_DENSE_DISABLE.name, "1")
    raw, qt, dense = raw_tensor("BF16")
    b = backend()
    w = b.load_weight(raw, qt)
    calls = []
    _spy(monkeypatch, calls, b)
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    got = b.matmul(b.from_numpy(x), w).double().numpy()
    assert calls == [] and b.paths["native dense matmuls"].path == "torch"
    want = b.from_numpy(x).double().numpy() @ dense.T
    assert np.abs(got - want).max() <= 2.0**-7 * np.abs(want).max()
    assert b._native_gemv(w, 1) is None  # nor batched, nor in the decoder block


def test_matmul_n_batches_dense_weights(native, monkeypatch):
    b = backend()
    ws = [b.load_weight(*raw_tensor("BF16", n, 64, seed=n)[:2]) for n in (16, 8, 8)]
    calls = []
    _spy(monkeypatch, calls, b)
    x = b.from_numpy(np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32))
    outs = b.matmul_n(x, ws)
    assert calls == [("BF16", 2)]
    for w, y in zip(ws, outs, strict=True):
        assert torch.equal(y, b.matmul(x, w))


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense") / "default-bf16.gguf"
    quantize_model(default_model_path(), path, "BF16", RUNTIME)
    return path


@pytest.mark.parametrize("f32_acts", ACTIVATIONS)
def test_decoder_block_on_bf16_weights_equals_the_op_by_op_path(
    native, bf16_model, f32_acts, monkeypatch
):
    """A BF16 model decodes through the fused native block (the same dense GEMV as the op
    path, so the same logits bit for bit) and stays close to the numpy backend."""
    blocks = []
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", f32_acts)
    real = kernels.NativeGemv.block_decode
    monkeypatch.setattr(
        kernels.NativeGemv, "block_decode", lambda s, *a: blocks.append(1) or real(s, *a)
    )

    def decode(backend_name, switch="0", tokens=None):
        monkeypatch.setenv("TESSERA_DECODER_BLOCK_DISABLE", switch)
        options = {"dtype": "bf16"} if backend_name == "torch" else {}
        model = load_model(bf16_model, RUNTIME, backend_name, **options)
        prompt = model.tokenizer.encode("def main():")
        ctx = Context(model, ContextParams(n_ctx=64))
        last = ctx.decode(Batch.for_sequence(prompt))[-1]
        tokens = tokens or []
        out = []
        for i in range(4):
            if len(tokens) <= i:  # greedy on the first run, the same tokens on the others
                tokens.append(int(last.argmax()))
            last = ctx.decode(Batch.for_sequence([tokens[i]], start_pos=len(prompt) + i))[-1]
            out.append(last)
        return np.array(out), model.config, tokens

    fused, config, tokens = decode("torch")
    assert len(blocks) == 4 * config.n_layer
    op_by_op, _, _ = decode("torch", "1", tokens)
    assert len(blocks) == 4 * config.n_layer
    assert_block_equals_ops(fused, op_by_op, f32_acts)
    ref, _, _ = decode("numpy", tokens=tokens)
    assert np.abs(fused - ref).max() <= 0.05 * np.abs(ref).max()

"""The native kernels of the block types beyond Q4_0/Q8_0 (Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS,
MXFP4, NVFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0): the decode GEMV against numpy's
dequantize-then-matmul in float64 within the int8-activation bound (and against the same
activation rounding done in numpy within float32 sums), the prefill dequantization bit for
bit the numpy values rounded by torch, each CPU code path forced by compiler flags, and the
quant plugins' torch weights on them: the row split, the switches, memory, the fused decoder
block, a model's tokens.

Weights are the plugins' own quantization of random values (every type bit-exact with
llama.cpp) and random block bytes with finite float16 fields (every code and scale byte).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from block_checks import ACTIVATIONS, assert_block_equals_ops
from gguf_checks import int8_activations, with_threads  # a sibling module

from tessera.backends.native import cpu_paths, library, selftest
from tessera.backends.native.typed_gemv import GGML_TYPES, GRID_TYPES
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import RawTensor
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model
from tessera.plugins.quant.native_weight import NativeBlockWeight

RUNTIME = Runtime()
#: The types tessera writes (the grid types, read only: test_native_iq_grid_types.py).
KINDS = [kind for kind in GGML_TYPES if kind not in GRID_TYPES]


def backend(dtype="bf16"):
    b = RUNTIME.create_backend("torch", device="cpu", dtype=dtype)
    RUNTIME.equip(b)
    return b


def quantized(kind, n_out, n_in, seed=0):
    """The plugin's quantization of random values, with an all-zero row, a row of one sign
    and a tiny one; its numpy dequantization (float64)."""
    qt = RUNTIME.quant_type_by_name(kind)
    values = np.random.default_rng(seed).standard_normal((n_out, n_in)).astype(np.float32)
    values[0] = 0.0
    if n_out > 2:
        values[1] = np.abs(values[1])
        values[2] *= np.float32(1e-3)
    raw = qt.quantize_tensor(values).reshape(n_out, -1)
    return raw, qt.dequantize(raw).astype(np.float64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out,n_in,rows", [(1, 256, 1), (7, 512, 2), (37, 768, 5), (130, 256, 9)])
def test_gemv_matches_numpy_within_the_int8_activation_bound(
    native, kind, threads, n_out, n_in, rows
):
    raw, dense = quantized(kind, n_out, n_in, seed=n_out + rows)
    x = np.random.default_rng(rows).standard_normal((rows, n_in)).astype(np.float32)
    x[0, :32] = 0  # an all-zero activation block (scale 0)
    got = with_threads(
        threads, lambda: native.matmul(kind, torch.from_numpy(raw), torch.from_numpy(x))
    )
    got = got.numpy()
    want = x.astype(np.float64) @ dense.T
    assert got.dtype == np.float32 and got.shape == (rows, n_out)
    assert np.all(np.abs(got - want) <= selftest.error_bound(dense, x))
    xq = int8_activations(x)  # exactly what int8 activations give, up to float32 sums
    assert np.all(np.abs(got - xq @ dense.T) <= 1e-5 * (np.abs(xq) @ np.abs(dense).T) + 1e-30)


@pytest.mark.parametrize("kind", KINDS)
def test_every_code_and_scale_byte_multiplies_as_gguf_decodes_it(native, kind):
    """Random block bytes (the gguf package's dequantization as the oracle), bf16 and f16
    activations in and out, several weights with biases in one call."""
    rng = np.random.default_rng(3)
    raws = [selftest.random_blocks(kind, n, 512, rng) for n in (9, 4, 6)]
    oracle = selftest._GgufOracle(kind)
    dense = np.concatenate([oracle.dequantize(r) for r in raws]).astype(np.float64)
    for dtype, step in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        x = torch.from_numpy(rng.standard_normal((3, 512)).astype(np.float32)).to(dtype)
        bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).to(dtype)
        ws = tuple(torch.from_numpy(r) for r in raws)
        got = native.matmul_n(kind, ws, x, (None, bias, None))
        assert got.dtype == dtype
        xs = x.float().numpy()
        want = xs.astype(np.float64) @ dense.T
        want[:, 9:13] += bias.float().numpy()
        bound = selftest.error_bound(dense, xs) + step * np.abs(want)
        assert np.all(np.abs(got.float().numpy() - want) <= bound)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantization_is_the_numpy_values_bit_for_bit(native, kind, dtype):
    qt = RUNTIME.quant_type_by_name(kind)
    rng = np.random.default_rng(4)
    raw = selftest.random_blocks(kind, 11, 768, rng)
    raw[3] = quantized(kind, 1, 768)[0][0]  # an all-zero row: scales 0
    want = torch.from_numpy(qt.dequantize(raw)).to(dtype)
    got = with_threads(2, lambda: native.dequantize(kind, torch.from_numpy(raw), dtype))
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["Q5_0", "Q4_K", "Q6_K", "IQ4_NL"])
def test_infinite_and_nan_scales_stay_inf_and_nan(native, kind):
    """A float16 scale of inf or NaN gives inf/NaN values where numpy gives them (NaN is
    not rounded into a number by the bf16 conversion)."""
    qt = RUNTIME.quant_type_by_name(kind)
    raw = selftest.random_blocks(kind, 4, 256, np.random.default_rng(5))
    at = selftest.F16_FIELDS[kind][0]
    raw[1, at : at + 2] = np.array([np.inf], "<f2").view(np.uint8)
    raw[2, at : at + 2] = np.array([0x7FFF], "<u2").view(np.uint8)  # NaN, every payload bit
    with np.errstate(invalid="ignore", over="ignore"):
        want = torch.from_numpy(qt.dequantize(raw)).bfloat16()
    got = native.dequantize(kind, torch.from_numpy(raw), torch.bfloat16)
    assert torch.equal(got.isnan(), want.isnan()) and bool(want.isnan().any())
    finite = ~want.isnan()
    assert torch.equal(got[finite], want[finite])


@pytest.mark.parametrize(
    "flags,needs,zmm,vnni",
    [((), "avx512_vnni", 1, 1), (("-mno-avx512f",), "avx_vnni", 0, 1),
     (("-mno-avx512f", "-mno-avxvnni"), "avx2", 0, 0)],
    ids=["avx512-vnni", "avx-vnni-256", "avx2-maddubs"],
)  # fmt: skip
def test_each_cpu_path_forced_by_its_flags(native, tmp_path, monkeypatch, flags, needs, zmm, vnni):
    """The library built for each path passes the whole self-test (Q4_0/Q8_0, the block
    types, norms, RoPE, attention) and multiplies as the native build does."""
    if needs not in library.cpu_flags():
        # Real skip: a build for this path runs only on a CPU with its instructions
        pytest.skip(f"this CPU has no {needs}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    lib = library.load(library.build(flags=library.CFLAGS + flags))
    assert (lib.lib.tsr_native_zmm(), lib.lib.tsr_native_vnni()) == (zmm, vnni)
    assert selftest.self_test(lib, threads=2)
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((5, 512)).astype(np.float32))
    for kind in ["Q4_0", "Q8_0", *KINDS]:
        raw = torch.from_numpy(quantized(kind, 19, 512, seed=7)[0])
        got, want = lib.matmul(kind, raw, x).numpy(), native.matmul(kind, raw, x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def raw_tensor(kind, n_out=40, n_in=512, seed=8):
    raw, dense = quantized(kind, n_out, n_in, seed)
    qt = RUNTIME.quant_type_by_name(kind)
    return RawTensor("blk.0.ffn_up.weight", qt.ggml_type, (n_out, n_in), raw.reshape(-1)), qt, dense


@pytest.mark.parametrize("kind", KINDS)
def test_torch_weights_decode_natively_and_prefill_on_the_native_dequantization(
    native, kind, monkeypatch
):
    """Below the weight's max_rows the GEMV reads the file's bytes; from there the native
    dequantization feeds a dense matmul; rows of the table are the dequantized rows."""
    raw, qt, dense = raw_tensor(kind)
    b = backend()
    w = b.load_weight(raw, qt)
    assert isinstance(w, NativeBlockWeight) and b.placements[0][1] == f"kernel {kind}"
    assert b.paths[f"quant decode GEMV {kind}"].path == cpu_paths.quant_path(native.isa, False)
    assert w.raw.numpy().nbytes == raw.data.nbytes  # the file's bytes, no dense copy
    calls = []
    for name in ("matmul", "dequantize_typed"):
        original = getattr(type(native), name)
        monkeypatch.setattr(type(native), name, _spy(original, name, calls))
    top = w.max_rows  # NATIVE_MAX_ROWS, or AMX_MAX_ROWS with AMX tiles
    x = np.random.default_rng(9).standard_normal((top, 512)).astype(np.float32)
    for rows, path in ((1, "matmul"), (top - 1, "matmul"), (top, "dequantize_typed")):
        calls.clear()
        want = x[:rows] @ dense.T
        got = b.to_numpy(b.matmul(b.from_numpy(x[:rows]), w))
        assert calls == [path] and np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
        assert (w.native_gemv(rows) is not None) == (path == "matmul")
    ids = np.array([3, 0, 3, 39])
    rows = torch.from_numpy(dense[ids].astype(np.float32)).bfloat16()
    assert torch.equal(b.get_rows(w, ids), rows)


def _spy(original, name, calls):
    def spy(self, *args, **kwargs):
        calls.append(name)
        return original(self, *args, **kwargs)

    return spy


@pytest.mark.parametrize(
    "env,kind,expect",
    [({"TESSERA_NATIVE_QUANT_DISABLE": "q4_k,Q6_K"}, "Q4_K", "torch"),
     ({"TESSERA_NATIVE_QUANT_DISABLE": "Q4_K"}, "Q5_0", "native"),
     ({"TESSERA_NATIVE_QUANT_DISABLE": "all"}, "Q5_0", "torch"),
     ({"TESSERA_NATIVE_DISABLE": "1"}, "Q6_K", "torch")],
)  # fmt: skip
def test_switches_send_a_type_back_to_its_torch_path(native, monkeypatch, env, kind, expect):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    raw, qt, dense = raw_tensor(kind)
    b = backend()
    w = b.load_weight(raw, qt)
    assert isinstance(w, NativeBlockWeight) == (expect == "native")
    path = cpu_paths.quant_path(native.isa, False) if expect == "native" else cpu_paths.FALLBACK
    assert b.paths[f"quant decode GEMV {kind}"].path == path
    x = np.random.default_rng(10).standard_normal((2, 512)).astype(np.float32)
    want = x @ dense.T
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_f32_compute_keeps_the_exact_paths(native):
    raw, qt, _ = raw_tensor("Q6_K")
    b = backend("f32")
    assert not isinstance(b.load_weight(raw, qt), NativeBlockWeight)
    assert b.paths["quant decode GEMV Q6_K"].path == cpu_paths.FALLBACK


def test_backend_matmul_n_batches_weights_of_one_block_type(native, monkeypatch):
    calls = []
    original = type(native).gemv_typed
    monkeypatch.setattr(type(native), "gemv_typed", lambda self, kind, ws, x, biases=None: (
        calls.append((kind, len(ws))) or original(self, kind, ws, x, biases)
    ))  # fmt: skip
    b = backend()
    loaded = [raw_tensor("Q5_0", n, seed=n) for n in (24, 8, 8)]
    ws = [b.load_weight(raw, qt) for raw, qt, _ in loaded]
    x = np.random.default_rng(11).standard_normal((1, 512)).astype(np.float32)
    calls.clear()  # (the probes' self-test ran it too)
    ys = b.matmul_n(b.from_numpy(x), ws)
    assert calls == [("Q5_0", 3)]
    xb = b.to_numpy(b.from_numpy(x))  # the bf16 activations
    for y, (_, _, dense) in zip(ys, loaded, strict=True):
        want = xb @ dense.T
        bound = selftest.error_bound(dense, xb) + 2.0**-8 * np.abs(want)
        assert np.all(np.abs(b.to_numpy(y) - want) <= bound)


@pytest.mark.parametrize("kind", KINDS)
def test_no_rows_give_empty_outputs(native, kind):
    """A prefill chunk that asks for no logits prunes the last layer to zero rows: its
    matmuls (one weight, and Q/K/V or gate/up batched) answer with empty outputs."""
    b = backend()
    loaded = [raw_tensor(kind, n, seed=n) for n in (24, 8)]
    ws = [b.load_weight(raw, qt) for raw, qt, _ in loaded]
    x = b.from_numpy(np.zeros((0, 512), np.float32))
    assert tuple(b.matmul(x, ws[0]).shape) == (0, 24)
    assert [tuple(y.shape) for y in b.matmul_n(x, ws)] == [(0, 24), (0, 8)]


# -- models: the trained default model in llama-quantize's mixes ------------------------


@pytest.fixture(scope="module", params=["Q4_K_M", "Q5_K_M", "IQ4_XS", "Q4_1"])
def mixed_model(request, tmp_path_factory):
    """Q4_K_M: Q4_K, Q6_K, Q5_0, Q8_0; Q5_K_M: Q5_K, Q6_K, Q5_1; IQ4_XS: IQ4_XS, IQ4_NL,
    Q6_K; Q4_1 (rows of 704 do not fill blocks of 256, hence the fallbacks)."""
    path = tmp_path_factory.mktemp("mixes") / f"default-{request.param}.gguf"
    quantize_model(default_model_path(), path, request.param, RUNTIME)
    return path


def decode_logits(path, monkeypatch, env):
    """The logits of 6 decode steps after a prompt (fixed tokens, one at a time), with
    ``env`` set at load."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    model = load_model(path, RUNTIME, "torch", dtype="bf16")
    for name in env:
        monkeypatch.delenv(name)
    prompt, tokens = model.tokenizer.encode("def main():"), model.tokenizer.encode(" return 0")
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.decode(Batch.for_sequence(prompt))
    out = []
    for i, token in enumerate((tokens * 6)[:6]):
        out.append(ctx.decode(Batch.for_sequence([token], start_pos=len(prompt) + i))[-1])
    return np.array(out), model


@pytest.mark.parametrize("f32_acts", ACTIVATIONS)
def test_decoder_block_equals_the_op_by_op_path(native, mixed_model, f32_acts, monkeypatch):
    """The fused block takes the block types too: the same logits bit for bit as the same
    kernels op by op; and both within bf16's reach of the torch path without them."""
    calls = []
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", f32_acts)
    original = type(native).block_decode
    monkeypatch.setattr(type(native), "block_decode", lambda self, block, step, x: (
        calls.append(1) or original(self, block, step, x)
    ))  # fmt: skip
    fused, model = decode_logits(mixed_model, monkeypatch, {})
    assert len(calls) == 6 * model.config.n_layer
    block = model.graph._decoder_blocks()[0]
    names = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    assert any(isinstance(getattr(block, name), NativeBlockWeight) for name in names)
    op_by_op, _ = decode_logits(mixed_model, monkeypatch, {"TESSERA_DECODER_BLOCK_DISABLE": "1"})
    assert_block_equals_ops(fused, op_by_op, f32_acts)
    torch_path, _ = decode_logits(mixed_model, monkeypatch, {"TESSERA_NATIVE_QUANT_DISABLE": "all"})
    assert np.abs(fused - torch_path).max() <= 0.05 * np.abs(torch_path).max()


def test_greedy_text_equals_the_numpy_backend(native, mixed_model):
    ref = load_model(mixed_model, RUNTIME, "numpy")
    fast = load_model(mixed_model, RUNTIME, "torch", dtype="bf16")
    prompt = ref.tokenizer.encode("The for statement")

    def greedy(model):
        ctx = Context(model, ContextParams(n_ctx=128))
        return list(generate(ctx, prompt, 8, Sampler(SamplerParams(temperature=0))))

    assert greedy(fast) == greedy(ref)

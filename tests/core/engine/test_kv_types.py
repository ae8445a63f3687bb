"""KV caches stored as f16 / q8_0 (``-ctk`` / ``-ctv``): the numpy form of the rounding
against ggml's (``gguf.quants``), every backend's storage bit for bit against it, attention
over the stored caches against float64 numpy over the same values, logits near the
compute-dtype cache's, state files that round-trip and name their types, the memory
guard, refusals, and the CLI flags."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from tessera.backends.native import selftest
from tessera.backends.native.kernels import RowLists
from tessera.backends.torch import kv_store
from tessera.cli.args import context_params_from_args
from tessera.cli.main import build_parser
from tessera.contract.arch import KVLayerLayout
from tessera.engine import kv_types
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.memory import OutOfMemoryError, check_kv_cache_fits, kv_cache_bytes
from tessera.engine.state import StateFileError
from tessera.errors import TesseraError
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.testing.conformance.kit import tolerance

RUNTIME = Runtime()


def rows(seed, *shape, scale=1.0):
    values = np.random.default_rng(seed).standard_normal(shape) * scale
    values[..., :32] *= 1e-3  # a block of small values (its own scale)
    values[0, 0, 32:64] = 0  # an all-zero block: d = 0, codes 0
    return values.astype(np.float32)


def test_q8_0_is_ggml_s_block_format_bit_for_bit():
    x = rows(0, 5, 2, 64, scale=3)
    x[1, 1, 3] = 0.5 * x[1, 1, 0:32].max()  # a tie after scaling is likely nowhere; halves
    got = kv_types.quantize_q8_0(x)
    want = quants.quantize(x.reshape(-1, 64), GGMLQuantizationType.Q8_0).reshape(got.shape)
    np.testing.assert_array_equal(got, want)
    back = quants.dequantize(want.reshape(-1, 68), GGMLQuantizationType.Q8_0).reshape(x.shape)
    np.testing.assert_array_equal(kv_types.dequantize_q8_0(got), back)
    assert got.shape == (5, 2, 68)


def test_torch_quantizes_as_numpy_does():
    x = rows(1, 7, 3, 96, scale=5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        held = torch.from_numpy(x).to(dtype)
        want = kv_types.quantize_q8_0(held.float().numpy())
        np.testing.assert_array_equal(kv_store.quantize(held).numpy(), want)


def test_stored_values_re_round_to_themselves():
    """What state files rely on: encoding the stored values again gives the same bytes."""
    x = rows(2, 4, 2, 64, scale=2)
    for kind in ("f16", "q8_0", "bf16"):
        held = kv_types.stored_values(x, kind)
        np.testing.assert_array_equal(kv_types.stored_values(held, kind), held)
        data = kv_types.encode(held, kind, "bf16")
        assert data.nbytes == kv_types.encoded_bytes(held.size, kind, "bf16")
        np.testing.assert_array_equal(kv_types.decode(data, kind, "bf16", held.shape), held)


def backend(name, dtype=None):
    b = RUNTIME.create_backend(name, **({"dtype": dtype} if dtype else {}))
    RUNTIME.equip(b)
    return b


BACKENDS = [("numpy", None), ("torch", "f32"), ("torch", "bf16")]


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
@pytest.mark.parametrize("name,dtype", BACKENDS)
def test_caches_hold_the_stored_values_and_attention_reads_them(name, dtype, kind):
    """set_rows rounds into the cache exactly as kv_types does; dense attention and
    attention_rows (the native kernel for few queries on torch) over it equal float64 numpy
    over the same values within the compute dtype's rounding."""
    b = backend(name, dtype)
    shape = (12, 2, 64)
    k_cache, v_cache = b.kv_cache(shape, kind), b.kv_cache(shape, kind)
    cells = np.array([3, 0, 7, 8, 9])
    k_in, v_in = b.from_numpy(rows(3, 5, 2, 64, scale=2)), b.from_numpy(rows(4, 5, 2, 64))
    b.set_rows(k_cache, cells, k_in)
    b.set_rows(v_cache, cells[:1], v_in[:1])  # one cell (decode's write), then the rest
    b.set_rows(v_cache, cells[1:], v_in[1:])
    k, v = (np.zeros(shape, np.float32) for _ in range(2))
    k[cells] = kv_types.stored_values(b.to_numpy(k_in), kind)
    v[cells] = kv_types.stored_values(b.to_numpy(v_in), kind)
    np.testing.assert_array_equal(b.get_n([k_cache, v_cache]), [k, v])
    q = b.from_numpy(rows(5, 2, 4, 64))
    lists = np.array([[3, 0, 7, 8, 9]]), np.array([[0, 1]])
    want = selftest.attention_reference(b.to_numpy(q), k, v, lists[0], lists[1], None, 0.125)
    mask = np.zeros((2, 12), bool)
    mask[:, cells] = True
    # SDPA and numpy: the conformance kit's attention budget (SDPA computes in the dtype)
    got = b.to_numpy(b.attention(q, k_cache, v_cache, 12, mask, 0.125))
    assert np.abs(got - want).max() <= tolerance("attention", b.dtype) * np.abs(want).max()
    if name == "torch":  # two queries: the native kernel, float32 over the stored values
        from tessera.engine.kv_view import KVRows

        kv_rows = KVRows(lists[1], np.full((1, 2), 9, np.int32), lists[0],
                         np.arange(5, dtype=np.int32)[None], np.arange(2))  # fmt: skip
        got = b.to_numpy(b.attention_rows(q, k_cache, v_cache, kv_rows, 0.125))
        step = {"f32": 1e-5, "bf16": 2.0**-8}[b.dtype]
        assert np.all(np.abs(got - want) <= step * np.abs(want) + 1e-5)


@pytest.mark.parametrize("kind", ["bf16", "f16", "q8_0"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_rows", [1, 33, 700, 5000])
def test_native_attention_over_each_storage_type(native_kernels, kind, threads, n_rows):
    """tsr_attention_kv (flash-decoding: tiles, an online softmax, rows split over the
    threads for one query) against float64 numpy, masked and padded rows included."""
    native = native_kernels
    native._threads = lambda: threads
    rng = np.random.default_rng(n_rows)
    cells, h, h_kv, d = n_rows + 8, 6, 2, 64
    kf = rng.standard_normal((cells, h_kv, d)).astype(np.float32) * 2
    vf = rng.standard_normal((cells, h_kv, d)).astype(np.float32)
    if kind == "q8_0":
        k, v = (torch.from_numpy(kv_types.quantize_q8_0(a)) for a in (kf, vf))
    else:
        k, v = (torch.from_numpy(a).to(kv_store.DTYPES[kind]) for a in (kf, vf))
    kn, vn = (kv_types.stored_values(a, kind) for a in (kf, vf))
    q = torch.from_numpy(rng.standard_normal((1, h, d)).astype(np.float32)).bfloat16()
    row_list = rng.permutation(cells)[:n_rows][None].astype(np.int64)
    row_list[0, n_rows // 2] = -1  # padding reads nothing
    allowed = rng.random((1, 1, n_rows)) < 0.9 if n_rows > 1 else None
    lists = RowLists(row_list, np.zeros((1, 1), np.int64), allowed)
    got = native.attention_kv(q, k, kind, v, kind, (cells, h_kv, d), lists, 0.125)
    want = selftest.attention_reference(q.float().numpy(), kn, vn, row_list, lists.q_rows,
                                        allowed, 0.125)  # fmt: skip
    got = got.float().numpy()
    assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want) + 1e-5)


@pytest.fixture(scope="module")
def native_kernels():
    from tessera.backends.native import probe

    gemv = probe.probe(backend("torch", "bf16"))
    if gemv is None:
        # Real skip: without AVX2 or a compiler there is no native kernel to test
        pytest.skip("native kernels unavailable here")
    return gemv


def decode_logits(model, type_k, type_v, n_steps=4):
    ctx = Context(model, ContextParams(n_ctx=64, type_k=type_k, type_v=type_v))
    prompt = model.tokenizer.encode("def main():\n    print(")
    out = [ctx.decode(Batch.for_sequence(prompt))[-1]]
    for i in range(n_steps):
        out.append(ctx.decode(Batch.for_sequence([7 + i], len(prompt) + i))[-1])
    return np.array(out), ctx


@pytest.mark.parametrize("name,dtype", BACKENDS)
def test_logits_stay_close_to_the_compute_dtype_cache(name, dtype):
    model = load_model(default_model_path(), RUNTIME, backend(name, dtype))
    base, _ = decode_logits(model, "", "")
    for type_k, type_v, budget in (
        ("f16", "f16", 2e-3),
        ("q8_0", "q8_0", 1e-2),
        ("q8_0", "f16", 1e-2),
    ):
        got, ctx = decode_logits(model, type_k, type_v)
        assert np.abs(got - base).max() <= budget * np.abs(base).max() + (
            0.02 if dtype == "bf16" else 0.0
        )  # fmt: skip
        assert (ctx.kv.type_k, ctx.kv.type_v) == (type_k, type_v)


@pytest.mark.parametrize("f32_acts", ["0", "1"])
def test_the_fused_block_stores_as_the_op_path_does(native_kernels, f32_acts, monkeypatch):
    """torch bf16 with the native decoder block: the block rounds K and V into a q8_0 / f16
    cache exactly as set_rows does, so with bf16 activations the logits equal the op-by-op
    path's bit for bit. With float32 activations they agree within 1e-4 of their scale, not
    bit for bit: the block's SwiGLU forms silu from its own e^x where the op path calls
    torch's F.silu (bf16's rounding of each output hid that float32 difference)."""
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", f32_acts)
    runs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("TESSERA_DECODER_BLOCK_DISABLE", switch)
        model = load_model(default_model_path(), RUNTIME, backend("torch", "bf16"))
        runs[switch] = decode_logits(model, "q8_0", "f16")[0]
        assert (model.backend.paths["decoder block"].path == "op by op") == (switch == "1")
    if f32_acts == "0":
        np.testing.assert_array_equal(runs["0"], runs["1"])
    else:
        assert np.abs(runs["0"] - runs["1"]).max() <= 1e-4 * np.abs(runs["1"]).max()


@pytest.mark.parametrize("name,dtype", BACKENDS)
def test_state_files_round_trip_in_the_cache_type(name, dtype, tmp_path):
    model = load_model(default_model_path(), RUNTIME, backend(name, dtype))
    sizes = {}
    for type_k, type_v in (("", ""), ("q8_0", "q8_0"), ("f16", "q8_0")):
        _, ctx = decode_logits(model, type_k, type_v, n_steps=1)
        path = tmp_path / f"{type_k}-{type_v}.state"
        ctx.save_state(path, 0, [1, 2, 3])
        sizes[type_k, type_v] = path.stat().st_size
        fresh = Context(model, ContextParams(n_ctx=64, type_k=type_k, type_v=type_v))
        assert fresh.load_state(path, 0) == [1, 2, 3]
        for a, b in zip(ctx.kv.k + ctx.kv.v, fresh.kv.k + fresh.kv.v, strict=True):
            np.testing.assert_array_equal(model.backend.to_numpy(a), model.backend.to_numpy(b))
        n = int(np.count_nonzero(ctx.kv.seqs))
        step = Batch.for_sequence([11], n)
        np.testing.assert_array_equal(ctx.decode(step), fresh.decode(step))
        if type_k:  # another context's types are refused, naming the flags to load it with
            other = Context(model, ContextParams(n_ctx=64))
            with pytest.raises(StateFileError, match=f"-ctk {type_k} -ctv {type_v}"):
                other.load_state(path, 0)
    assert sizes["q8_0", "q8_0"] < sizes["f16", "q8_0"] < sizes["", ""]


def test_memory_guard_counts_the_stored_types():
    layout = [KVLayerLayout(2, 64, 64), None, KVLayerLayout(2, 64, 64, v_in_k=True)]
    per_value = {"f32": 4, "f16": 2, "q8_0": 34 / 32}
    assert kv_cache_bytes(layout, 100, "f32") == 100 * 2 * 64 * 3 * 4
    got = kv_cache_bytes(layout, 100, "bf16", "q8_0", "f16")
    assert got == 100 * 2 * 64 * (2 * per_value["q8_0"] + per_value["f16"])
    need = kv_cache_bytes(layout, 1000, "bf16")
    with pytest.raises(OutOfMemoryError, match="store it as q8_0"):
        check_kv_cache_fits(layout, 1000, "bf16", need - 1)
    check_kv_cache_fits(layout, 1000, "bf16", need - 1, "q8_0", "q8_0")  # fits as q8_0


def test_types_a_context_cannot_store_are_refused():
    model = load_model(default_model_path(), RUNTIME, backend("numpy"))
    with pytest.raises(TesseraError, match="unknown KV cache type 'q4_2'"):
        ContextParams(type_k="q4_2")
    with pytest.raises(TesseraError, match="multiples of 32"):
        kv_types.check_layout([KVLayerLayout(2, 48, 64)], "q8_0", "f16")
    with pytest.raises(TesseraError, match="V inside its K cache"):
        kv_types.check_layout([KVLayerLayout(1, 64, 32, v_in_k=True)], "f16", "q8_0")
    model.backend.supports = lambda op: op.name != "kv_cache"  # a backend without the op
    with pytest.raises(TesseraError, match="cannot store a q8_0 KV cache"):
        Context(model, ContextParams(n_ctx=16, type_k="q8_0"))
    Context(model, ContextParams(n_ctx=16, type_k="F32"))  # the compute dtype: no op needed


def test_cli_flags_are_llama_cpp_s():
    model = load_model(default_model_path(), RUNTIME, backend("numpy"))
    args = build_parser(RUNTIME).parse_args(["run", "-ctk", "q8_0", "--cache-type-v", "F16"])
    params = context_params_from_args(args, model)
    assert (params.type_k, params.type_v) == ("q8_0", "f16")

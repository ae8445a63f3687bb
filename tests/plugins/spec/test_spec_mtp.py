"""The ``mtp`` spec decoder: the nextn block's math against a numpy oracle, the GGUF
layout llama.cpp uses, and the refusal of models without MTP layers."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.contract.spec import SpecParams
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.files.gguf import read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def mtp_file(tmp_path_factory, runtime):
    return make_gguf(tmp_path_factory.mktemp("mtp") / "m.gguf", n_nextn=1, seed=3, runtime=runtime)


def test_gguf_layout_follows_llama_cpp(mtp_file):
    g = read_gguf(mtp_file)
    assert g.metadata["llama.nextn_predict_layers"] == 1
    assert g.metadata["llama.block_count"] == 3  # 2 main blocks + the nextn block
    for name in ("eh_proj", "enorm", "hnorm", "shared_head_norm"):
        assert f"blk.2.nextn.{name}.weight" in g.tensors
    assert g.tensors["blk.2.nextn.eh_proj.weight"].shape == (64, 128)
    assert "blk.2.attn_q.weight" in g.tensors and "blk.2.ffn_down.weight" in g.tensors


def test_main_model_ignores_the_nextn_block(mtp_file, runtime, tmp_path):
    """Loading reads n_layer = block_count - nextn_predict_layers: the logits are those of
    the same file with the nextn block and its keys taken out."""
    with_mtp = load_model(mtp_file, runtime, "numpy")
    assert with_mtp.config.n_layer == 2 and with_mtp.config.n_nextn == 1
    g = read_gguf(mtp_file)
    meta = {k: v for k, v in g.metadata.items() if k != "llama.nextn_predict_layers"}
    meta["llama.block_count"] = 2
    kept = [t for name, t in g.tensors.items() if not name.startswith("blk.2.")]
    plain = load_model(write_gguf(tmp_path / "p.gguf", meta, kept), runtime, "numpy")
    tokens = [5, 9, 40, 7]
    outs = []
    for m in (with_mtp, plain):
        ctx = Context(m, ContextParams(n_ctx=16))
        outs.append(ctx.decode(Batch.for_sequence(tokens, 0, 0, "all")))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def test_first_draft_logits_match_a_numpy_oracle(mtp_file, runtime):
    """One MTP row attends only to itself, so attention returns its V projection: the
    whole block is then plain numpy over the file's dequantized weights."""
    model = load_model(mtp_file, runtime, "numpy")
    c = model.config
    ctx = Context(model, ContextParams(n_ctx=16))
    decoder = create_decoder(runtime, "mtp", ctx, SpecParams())
    ctx.decode(Batch.for_sequence([17], 0, 0, "all"))  # the prompt: one token
    decoder.begin([17], 0)
    h0 = decoder.h[0].copy()
    logits, _ = decoder._catch_up([17, 123])  # row (h_0, t_1 = 123) at position 1

    g = read_gguf(mtp_file)

    def w(name):
        t = g.tensors[name]
        return runtime.quant_type(t.ggml_type).dequantize_tensor(t.data, t.shape)

    p, eps = "blk.2.", c.rms_eps
    e = w("token_embd.weight")[123]
    x = w(p + "nextn.eh_proj.weight") @ np.concatenate(
        [_rms(e, w(p + "nextn.enorm.weight"), eps), _rms(h0, w(p + "nextn.hnorm.weight"), eps)]
    )
    a = _rms(x, w(p + "attn_norm.weight"), eps)
    v = (w(p + "attn_v.weight") @ a).reshape(c.n_head_kv, c.head_dim)
    o = np.repeat(v, c.n_head // c.n_head_kv, axis=0).reshape(-1)
    x = x + w(p + "attn_output.weight") @ o
    f = _rms(x, w(p + "ffn_norm.weight"), eps)
    gate, up = w(p + "ffn_gate.weight") @ f, w(p + "ffn_up.weight") @ f
    x = x + w(p + "ffn_down.weight") @ (gate / (1 + np.exp(-gate)) * up)
    head = w("output.weight") if "output.weight" in g.tensors else w("token_embd.weight")
    want = head @ _rms(x, w(p + "nextn.shared_head_norm.weight"), eps)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4)
    decoder.close()
    assert model.graph.hidden_sink is None  # close() stops collecting hidden states


def test_plain_decodes_between_speculative_runs_do_not_confuse_the_head(mtp_file, runtime):
    """The target collects hidden states for the head on every forward; plain generations
    with the same model in between (a server mixing requests) must not shift them."""
    from tessera.engine.generate import generate
    from tessera.engine.sampling import Sampler, SamplerParams

    model = load_model(mtp_file, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=64))
    params = SpecParams(draft_max=3, p_min=0.0)
    decoder = create_decoder(runtime, "mtp", ctx, params)
    greedy = SamplerParams(temperature=0.0)
    for prompt in ([4, 8, 15, 16], [23, 42, 4, 8, 15, 16, 23]):
        want = list(generate(ctx, prompt, 12, Sampler(greedy)))
        got = generate(ctx, prompt, 12, Sampler(greedy), decoder=decoder, spec=params)
        assert list(got) == want
        h = decoder.h[: len(prompt)].copy()
        ctx.kv.clear()
        model.graph.hidden_sink = []
        ctx.decode(Batch.for_sequence(prompt, 0, 0, "all"))
        np.testing.assert_allclose(h, model.backend.to_numpy(model.graph.hidden_sink[0]))

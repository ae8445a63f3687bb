"""Gemma 4 against HF transformers on a random-weight checkpoint transformers made itself.

The config has every Gemma-4 E-series part: KV sharing (3 of 8 layers write no KV), sliding
(window 4, shorter than the prompt) and global layers with a larger global head and
proportional RoPE (a quarter of the pairs rotate), per-layer embeddings, a double-wide FFN
in the shared layers, learned layer scalars and final-logit soft-capping (cap 0.5, so the
cap really bends the logits). tessera loads the safetensors folder and the GGUF that
``tessera convert`` writes, on numpy and torch (f32), and must reproduce transformers'
logits for every prompt row (measured max abs error <= 2.3e-6; logits std ~0.15) and its
greedy continuation, which runs with prefill pruning on (the default context).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers  # the oracle (in the test extra)

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.models import default_vocab, make_hf_dir

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
SOURCES = ("hf", "gguf-f32")
N_PROMPT, N_PREDICT, TOL = 12, 10, 2e-5
S, F = "sliding_attention", "full_attention"
LAYER_TYPES = [S, S, F, S, S, F, S, F]  # shared: layers 5-7, reading layers 4 (S) and 2 (F)


def gemma4_hf_dir(path, seed=3, **overrides):
    hf = {
        "global_head_dim": 32,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": default_vocab().n_vocab,
        "num_kv_shared_layers": 3,
        "layer_types": LAYER_TYPES,
        "sliding_window": 4,
        "final_logit_softcapping": 0.5,
        "use_double_wide_mlp": True,
    } | overrides
    return make_hf_dir(
        path, "gemma4_text", seed=seed, n_embd=64, n_layer=len(hf["layer_types"]), n_head=4,
        n_head_kv=2, n_ff=96, head_dim=16, tie_word_embeddings=True, hf_overrides=hf,
    )  # fmt: skip


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemma4")
    folder = gemma4_hf_dir(tmp / "gemma4")
    files = {"hf": folder, "gguf-f32": convert_hf_to_gguf(folder, tmp / "g.gguf", RUNTIME, "f32")}
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    prompt = np.random.default_rng(7).integers(0, model.config.vocab_size, N_PROMPT)
    ids = torch.tensor(prompt)[None]
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    return {
        "files": files,
        "prompt": prompt,
        "logits": logits,
        "greedy": out[0, N_PROMPT:].tolist(),
    }


def load(path, backend_name):
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend_name, dtype="f32"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(oracle, source, backend):
    ctx = Context(load(oracle["files"][source], backend), ContextParams(n_ctx=64))
    logits = ctx.decode(Batch.for_sequence(oracle["prompt"], logits="all"))
    assert logits.shape == oracle["logits"].shape
    assert np.abs(logits - oracle["logits"]).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_generate(oracle, source, backend):
    model = load(oracle["files"][source], backend)
    ctx = Context(model, ContextParams(n_ctx=64))
    assert ctx.prune_ok
    sampler = Sampler(SamplerParams(temperature=0))
    tokens = list(generate(ctx, oracle["prompt"].tolist(), N_PREDICT, sampler))
    assert tokens == oracle["greedy"]


def test_shared_layers_get_no_cache_tensors(oracle):
    model = load(oracle["files"]["gguf-f32"], "numpy")
    ctx = Context(model, ContextParams(n_ctx=16))
    owners = [k is not None for k in ctx.kv.k]
    assert owners == [True] * 5 + [False] * 3
    assert [v is not None for v in ctx.kv.v] == owners
    # sliding layers cache 16-wide heads, global ones 32-wide
    assert [k.shape[-1] for k in ctx.kv.k[:5]] == [16, 16, 32, 16, 16]


def test_gguf_uses_llama_cpp_keys_and_tensor_names(oracle):
    from tessera.files.gguf import read_gguf

    gguf = read_gguf(oracle["files"]["gguf-f32"])
    meta = gguf.metadata
    assert meta["general.architecture"] == "gemma4"
    assert meta["gemma4.attention.shared_kv_layers"] == 3
    assert meta["gemma4.embedding_length_per_layer_input"] == 8
    assert list(meta["gemma4.attention.sliding_window_pattern"]) == [t == S for t in LAYER_TYPES]
    assert meta["gemma4.attention.key_length"] == 32
    assert meta["gemma4.attention.key_length_swa"] == 16
    assert list(meta["gemma4.feed_forward_length"]) == [96] * 5 + [192] * 3
    assert meta["gemma4.final_logit_softcapping"] == pytest.approx(0.5)
    names = set(gguf.tensors)
    assert {
        "per_layer_token_embd.weight",
        "per_layer_model_proj.weight",
        "rope_freqs.weight",
    } <= names
    assert "blk.0.attn_k.weight" in names and "blk.5.attn_k.weight" not in names
    assert {
        "blk.7.inp_gate.weight",
        "blk.7.proj.weight",
        "blk.7.layer_output_scale.weight",
    } <= names
    factors = gguf.tensors["rope_freqs.weight"]
    values = np.frombuffer(factors.data.tobytes(), dtype=np.float32)
    assert values.tolist()[:4] == [1.0] * 4 and (values[4:] > 1e29).all()  # 0.25 of 16 pairs

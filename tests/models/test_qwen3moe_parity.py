"""Qwen3-MoE, Qwen2-MoE and Mixtral against HF transformers on random-weight checkpoints.

Each case is a genuine HF checkpoint made by ``transformers`` (float32, 8 experts, top-2;
with and without ``norm_topk_prob``; Qwen2-MoE's shared expert and Q/K/V biases; Mixtral,
6 experts top-2, whose GGUF is llama.cpp's ``llama`` with experts and permuted Q/K). tessera
loads it from the safetensors folder and from the GGUF ``tessera convert`` writes (stacked
``ffn_*_exps`` tensors), on every installed backend in f32, and must reproduce
transformers' logits for every prompt row and its greedy continuation. The routed-experts
op and its core-op fallback (``TESSERA_MOE_FFN_DISABLE``) are both checked.

Tolerance: max abs logit difference < 1e-5 (logits have std ~0.16).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers  # the oracle (in the test extra)

from tessera.contract.experts import MOE_FFN_DISABLE_ENV
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.models import make_gguf, make_hf_dir
from tessera.testing.pytest_plugin import architecture_conformance

MOE = {"n_expert": 8, "n_expert_used": 2, "n_ff_exp": 32}
CASES = {
    "qwen3moe-norm": ("qwen3_moe", MOE | {"norm_topk_prob": True}),
    "qwen3moe-no-norm-tied": (
        "qwen3_moe",
        MOE | {"norm_topk_prob": False, "tie_word_embeddings": True},
    ),
    "qwen2moe-shared-expert": ("qwen2_moe", MOE | {"n_ff_shexp": 48, "norm_topk_prob": False}),
    # Mixtral's own config fields: experts as wide as intermediate_size, always renormalized
    "mixtral": (
        "mixtral",
        {"n_ff": 32, "hf_overrides": {"num_local_experts": 6, "num_experts_per_tok": 2}},
    ),
}
SOURCES = ("hf", "gguf-f32")
N_PROMPT, N_PREDICT = 12, 10
F32_TOL = 1e-5

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])


class Oracle:
    """One HF MoE checkpoint, its converted GGUF and transformers' answers for a prompt."""

    def __init__(self, folder, tmp):
        self.folder = folder
        out = tmp / f"{folder.name}-f32.gguf"
        self.files = {"hf": folder, "gguf-f32": convert_hf_to_gguf(folder, out, RUNTIME, "f32")}
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.generation_config.eos_token_id = None
        self.prompt = np.random.default_rng(7).integers(0, model.config.vocab_size, N_PROMPT)
        ids = torch.tensor(self.prompt)[None]
        with torch.no_grad():
            self.logits = model(ids).logits[0].numpy()
            out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
        self.greedy = out[0, N_PROMPT:].tolist()


@pytest.fixture(scope="module", params=list(CASES))
def oracle(request, tmp_path_factory):
    arch, kwargs = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    return Oracle(make_hf_dir(tmp / request.param, arch, seed=3, **kwargs), tmp)


def load(path, backend_name):
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend_name, dtype="f32"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(oracle, source, backend):
    ctx = Context(load(oracle.files[source], backend), ContextParams(n_ctx=64))
    logits = ctx.decode(Batch.for_sequence(oracle.prompt, logits="all"))
    assert logits.shape == oracle.logits.shape
    assert np.abs(logits - oracle.logits).max() < F32_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_generate(oracle, source, backend):
    ctx = Context(load(oracle.files[source], backend), ContextParams(n_ctx=64))
    tokens = list(
        generate(ctx, oracle.prompt.tolist(), N_PREDICT, Sampler(SamplerParams(temperature=0)))
    )
    assert tokens == oracle.greedy


@pytest.mark.parametrize("backend", BACKENDS)
def test_core_op_fallback_matches_transformers(oracle, backend, monkeypatch):
    monkeypatch.setenv(MOE_FFN_DISABLE_ENV, "1")
    model = load(oracle.files["gguf-f32"], backend)
    assert ("moe_ffn", "core-op fallback", f"disabled by {MOE_FFN_DISABLE_ENV}=1") in (
        model.backend.placements
    )
    logits = Context(model, ContextParams(n_ctx=64)).decode(
        Batch.for_sequence(oracle.prompt, logits="all")
    )
    assert np.abs(logits - oracle.logits).max() < F32_TOL


def test_routed_op_is_the_path_taken_where_supported(oracle):
    model = load(oracle.files["gguf-f32"], "numpy")
    assert ("moe_ffn", "moe_ffn", "backend supports moe_ffn") in model.backend.placements


# The architecture conformance kit (forward, KV cache) on GGUF files made from the plugin's
# own example_config, for both archs and on torch bf16 as well.
test_qwen3moe_conformance = architecture_conformance("qwen3moe")
test_qwen2moe_conformance = architecture_conformance("qwen2moe")
test_qwen3moe_conformance_torch_bf16 = architecture_conformance(
    "qwen3moe", backend="torch", dtype="bf16"
)


def test_fused_transformers5_expert_tensors_stack_like_per_expert_ones():
    from tessera.models.llama.moe_hf import stacked_experts

    config = RUNTIME.architecture("qwen3moe").example_config(n_expert=4, n_ff_exp=8, n_embd=16)
    rng = np.random.default_rng(0)
    per = {
        f"mlp.experts.{e}.{p}.weight": rng.standard_normal(s).astype(np.float32)
        for e in range(4)
        for p, s in (("gate_proj", (8, 16)), ("up_proj", (8, 16)), ("down_proj", (16, 8)))
    }

    def stack(*projs):
        return np.stack(
            [np.concatenate([per[f"mlp.experts.{e}.{p}.weight"] for p in projs]) for e in range(4)]
        )

    fused = {
        "mlp.experts.gate_up_proj": stack("gate_proj", "up_proj"),
        "mlp.experts.down_proj": stack("down_proj"),
    }
    want = dict(stacked_experts(config, 0, {n: n for n in per}, per))
    got = dict(stacked_experts(config, 0, {n: n for n in fused}, fused))
    assert list(got) == ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                         "blk.0.ffn_down_exps.weight"]  # fmt: skip
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


def test_mixtral_gguf_is_llama_cpps_llama_with_experts(tmp_path):
    kwargs = CASES["mixtral"][1]
    folder = make_hf_dir(tmp_path / "hf", "mixtral", seed=1, n_layer=1, **kwargs)
    gguf = read_gguf(convert_hf_to_gguf(folder, tmp_path / "m.gguf", RUNTIME, "f32"))
    meta = gguf.metadata
    assert meta["general.architecture"] == "llama"
    assert (meta["llama.expert_count"], meta["llama.expert_used_count"]) == (6, 2)
    assert meta["llama.feed_forward_length"] == 32
    assert not any(k.startswith("llama.expert_") and k.endswith(("_length", "_norm"))
                   for k in meta)  # fmt: skip
    n_embd = meta["llama.embedding_length"]
    assert gguf.tensors["blk.0.ffn_gate_exps.weight"].shape == (6, 32, n_embd)
    assert gguf.tensors["blk.0.ffn_down_exps.weight"].shape == (6, n_embd, 32)
    assert gguf.tensors["blk.0.ffn_gate_inp.weight"].shape == (6, n_embd)
    assert not any(n.endswith(("ffn_gate.weight", "ffn_up.weight")) for n in gguf.tensors)
    for source, neox in ((tmp_path / "m.gguf", False), (folder, True)):
        model = load(source, "numpy")  # run by the MoE code, under the name llama
        assert model.arch.names == ("llama",) and model.experts is not None
        assert model.arch.variant(model.config) is model.arch
        assert model.config.rope_neox is neox  # GGUF llama: llama.cpp's permuted Q/K rows
    dense = make_gguf(tmp_path / "dense.gguf", "llama")  # no expert_count: the dense graph
    assert load(dense, "numpy").experts is None

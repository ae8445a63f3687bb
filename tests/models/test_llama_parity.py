"""Llama, Qwen2 and Qwen3 against HF transformers on random-weight checkpoints.

Each case is a genuine HF checkpoint made by ``transformers`` (float32, GQA, tied or untied
embeddings, Q/K/V biases). tessera loads it from the safetensors folder and from the GGUF
``tessera convert`` writes (f32 and f16), on every installed backend in f32, and must
reproduce transformers' logits for every prompt row and its greedy continuation.

Tolerances (max abs logit difference; logits have std ~0.16): f32 sources < 1e-5
(measured <= 3.6e-7 on numpy and torch); the f16 GGUF < 1e-5 against transformers running
the same f16-rounded 2-D weights (measured <= 2.7e-7) and < 2e-3 against the original f32
weights (measured <= 3.2e-4).
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
from tessera.testing.models import make_hf_dir

CASES = {
    "llama-gqa": ("llama", {}),
    "llama-tied-bias": (
        "llama",
        {"tie_word_embeddings": True, "hf_overrides": {"attention_bias": True}},
    ),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen2-untied": ("qwen2", {}),
    "qwen3-head-dim": ("qwen3", {"head_dim": 32}),  # head_dim != n_embd / n_head
}
SOURCES = ("hf", "gguf-f32", "gguf-f16")
N_PROMPT, N_PREDICT = 12, 10
F32_TOL, F16_TOL, F16_VS_F32_TOL = 1e-5, 1e-5, 2e-3

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])


class Oracle:
    """One HF checkpoint, its converted GGUFs and transformers' answers for a prompt."""

    def __init__(self, folder, tmp):
        self.folder = folder
        self.files = {"hf": folder}
        for outtype in ("f32", "f16"):
            out = tmp / f"{folder.name}-{outtype}.gguf"
            self.files[f"gguf-{outtype}"] = convert_hf_to_gguf(folder, out, RUNTIME, outtype)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        model.generation_config.eos_token_id = None  # tessera's generate has no EOG here either
        self.prompt = np.random.default_rng(7).integers(0, model.config.vocab_size, N_PROMPT)
        self.logits, self.greedy = self._answers(model)
        with torch.no_grad():  # the weights an f16 GGUF holds: 2-D rounded, 1-D kept f32
            for param in model.parameters():
                if param.ndim == 2:
                    param.copy_(param.half().float())
        self.logits_f16, self.greedy_f16 = self._answers(model)

    def _answers(self, model):
        ids = torch.tensor(self.prompt)[None]
        with torch.no_grad():
            logits = model(ids).logits[0].numpy()
            out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
        return logits, out[0, N_PROMPT:].tolist()


@pytest.fixture(scope="module", params=list(CASES))
def oracle(request, tmp_path_factory):
    arch, kwargs = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    return Oracle(make_hf_dir(tmp / request.param, arch, seed=3, **kwargs), tmp)


def load(path, backend_name):
    backend = RUNTIME.create_backend(backend_name, dtype="f32")
    return load_model(path, RUNTIME, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(oracle, source, backend):
    ctx = Context(load(oracle.files[source], backend), ContextParams(n_ctx=64))
    logits = ctx.decode(Batch.for_sequence(oracle.prompt, logits="all"))
    assert logits.shape == oracle.logits.shape
    if source == "gguf-f16":
        assert np.abs(logits - oracle.logits_f16).max() < F16_TOL
        assert np.abs(logits - oracle.logits).max() < F16_VS_F32_TOL
    else:
        assert np.abs(logits - oracle.logits).max() < F32_TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_generate(oracle, source, backend):
    ctx = Context(load(oracle.files[source], backend), ContextParams(n_ctx=64))
    sampler = Sampler(SamplerParams(temperature=0))
    tokens = list(generate(ctx, oracle.prompt.tolist(), N_PREDICT, sampler))
    assert tokens == (oracle.greedy_f16 if source == "gguf-f16" else oracle.greedy)


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi")
    folder = make_hf_dir(tmp / "llama", "llama", seed=5)
    return convert_hf_to_gguf(folder, tmp / "llama.gguf", RUNTIME, "f32")


@pytest.mark.parametrize("n_ubatch", [512, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_sequences_in_one_batch_match_each_decoded_alone(llama_gguf, backend, n_ubatch):
    model = load(llama_gguf, backend)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, model.n_vocab, 7), rng.integers(0, model.n_vocab, 5)]
    nxt = [rng.integers(0, model.n_vocab, 1) for _ in prompts]
    alone = []
    for prompt, token in zip(prompts, nxt, strict=True):
        ctx = Context(model, ContextParams(n_ctx=32))
        first = ctx.decode(Batch.for_sequence(prompt, logits="all"))
        second = ctx.decode(Batch.for_sequence(token, start_pos=len(prompt), logits="all"))
        alone.append((first, second))

    ctx = Context(model, ContextParams(n_ctx=32, n_seq_max=2, n_ubatch=n_ubatch))
    both = ctx.decode(
        Batch.concat([Batch.for_sequence(p, 0, s, "all") for s, p in enumerate(prompts)])
    )
    np.testing.assert_allclose(both[:7], alone[0][0], atol=1e-5)
    np.testing.assert_allclose(both[7:], alone[1][0], atol=1e-5)
    # The next step of both sequences, again in one batch, sees only its own history.
    pairs = enumerate(zip(prompts, nxt, strict=True))
    step = Batch.concat([Batch.for_sequence(t, len(p), s, "all") for s, (p, t) in pairs])
    both = ctx.decode(step)
    np.testing.assert_allclose(both[0], alone[0][1][0], atol=1e-5)
    np.testing.assert_allclose(both[1], alone[1][1][0], atol=1e-5)

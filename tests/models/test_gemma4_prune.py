"""Prefill pruning in the gemma4 architecture: same answers, and off whenever it must be.

The oracle is the same model and context with pruning switched off (every row through
every layer). Pruned and unpruned prefills must give the same final-row logits (to float
rounding: the pruned pass multiplies fewer rows, so BLAS may order sums differently;
measured max abs difference <= 2.4e-7 with logits std ~0.16) and the same greedy generations.
Each condition that must disable pruning is checked on its own, through what the graph
reports it did.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.contract.arch import ForwardInput
from tessera.engine.batch import Batch
from tessera.engine.context import PRUNE_DISABLE_ENV, Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf
from tessera.testing.pytest_plugin import architecture_conformance

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
N_PROMPT, N_PREDICT = 20, 8
DIMS = {"n_layer": 6, "n_swa": 5, "final_logit_softcapping": 1.0}

test_gemma4_architecture_conformance = architecture_conformance("gemma4", **DIMS)
test_gemma4_conformance_torch_bf16 = architecture_conformance(
    "gemma4", backend="torch", dtype="bf16", **DIMS
)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("g4") / "g4.gguf", "gemma4", seed=2, **DIMS)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request, gguf):
    return load_model(gguf, RUNTIME, RUNTIME.create_backend(request.param, dtype="f32"))


def prompt(model, n=N_PROMPT, seed=5):
    return np.random.default_rng(seed).integers(0, model.n_vocab, n)


def last_logits(model, params, tokens, logits="last"):
    ctx = Context(model, params)
    out = ctx.decode(Batch.for_sequence(tokens, logits=logits))
    return out, model.graph.last_pruned


@pytest.mark.parametrize("n_ubatch", [512, 7])
def test_pruned_prefill_gives_the_unpruned_final_row(model, n_ubatch):
    tokens = prompt(model)
    pruned, was_pruned = last_logits(model, ContextParams(n_ctx=64, n_ubatch=n_ubatch), tokens)
    full, was_full = last_logits(
        model, ContextParams(n_ctx=64, n_ubatch=n_ubatch, prune=False), tokens
    )
    assert was_pruned and not was_full
    assert pruned.shape == (1, model.n_vocab)
    np.testing.assert_allclose(pruned, full, rtol=0, atol=1e-6)
    assert int(pruned.argmax()) == int(full.argmax())


def test_pruned_rows_in_the_middle_of_a_batch(model):
    """Several output rows, not only the last: each matches the unpruned pass."""
    tokens = prompt(model)
    batch = Batch(tokens, np.arange(len(tokens)), np.zeros(len(tokens)), np.isin(
        np.arange(len(tokens)), [3, 11, 19]
    ))  # fmt: skip
    outs = []
    for prune in (True, False):
        ctx = Context(model, ContextParams(n_ctx=64, prune=prune))
        outs.append(ctx.decode(batch))
        assert model.graph.last_pruned is prune
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-6)


def test_generation_is_the_same_with_and_without_pruning(model):
    tokens = prompt(model).tolist()
    runs = []
    for prune in (True, False):
        ctx = Context(model, ContextParams(n_ctx=64, prune=prune))
        runs.append(list(generate(ctx, tokens, N_PREDICT, Sampler(SamplerParams(temperature=0)))))
    assert runs[0] == runs[1]
    assert len(runs[0]) == N_PREDICT


@pytest.mark.parametrize(
    "params, reason",
    [
        (ContextParams(n_ctx=64, prune=False), "--no-prune"),
        (ContextParams(n_ctx=64, n_seq_max=2), "n_seq_max 2 > 1"),
        (ContextParams(n_ctx=64, kv_unified=False), "not unified"),
    ],
)
def test_context_conditions_turn_pruning_off(model, params, reason):
    ctx = Context(model, params)
    assert not ctx.prune_ok and reason in ctx.prune_reason
    ctx.decode(Batch.for_sequence(prompt(model)))
    assert not model.graph.last_pruned
    assert ("prefill pruning", "off", ctx.prune_reason) in model.backend.placements


def test_env_switch_turns_pruning_off(model, monkeypatch):
    monkeypatch.setenv(PRUNE_DISABLE_ENV, "1")
    ctx = Context(model, ContextParams(n_ctx=64))
    assert not ctx.prune_ok and PRUNE_DISABLE_ENV in ctx.prune_reason
    ctx.decode(Batch.for_sequence(prompt(model)))
    assert not model.graph.last_pruned
    monkeypatch.setenv(PRUNE_DISABLE_ENV, "0")  # "0" means not set
    assert Context(model, ContextParams(n_ctx=64)).prune_ok


def test_intermediate_outputs_turn_pruning_off(model):
    ctx = Context(model, ContextParams(n_ctx=64))
    ctx.layer_outputs_wanted = True
    ctx.decode(Batch.for_sequence(prompt(model)))
    assert not model.graph.last_pruned


def test_embeddings_mode_is_never_pruned(model):
    """Embeddings need every row's hidden state through every layer."""
    tokens = prompt(model)
    ctx = Context(model, ContextParams(n_ctx=64))
    cells = ctx.kv.find_slot(len(tokens))
    ctx.kv.commit(cells, np.arange(len(tokens)), np.zeros(len(tokens), np.int32))
    view = ctx.kv.view(cells, np.arange(len(tokens)), np.zeros(len(tokens), np.int32))
    inp = ForwardInput(
        tokens, np.arange(len(tokens)), np.array([len(tokens) - 1]), view,
        embeddings=True, prune_ok=True,
    )  # fmt: skip
    hidden = model.backend.to_numpy(model.graph.forward(inp))
    assert not model.graph.last_pruned
    assert hidden.shape == (1, model.graph.c.n_embd)


def test_all_rows_wanted_is_not_pruned(model):
    ctx = Context(model, ContextParams(n_ctx=64))
    assert ctx.prune_ok
    ctx.decode(Batch.for_sequence(prompt(model), logits="all"))
    assert not model.graph.last_pruned


def test_no_kv_shared_layers_means_no_pruning(tmp_path):
    path = make_gguf(tmp_path / "plain.gguf", "gemma4", n_layer=6, n_kv_shared=0)
    model = load_model(path, RUNTIME, "numpy")
    assert all(k is not None for k in Context(model, ContextParams(n_ctx=32)).kv.k)
    ctx = Context(model, ContextParams(n_ctx=32))
    ctx.decode(Batch.for_sequence(prompt(model, 9)))
    assert not model.graph.last_pruned


def test_prefill_without_outputs_still_fills_the_cache(model):
    """A chunk with no output rows stops after the last KV-writing layer; the next chunk
    reads the same cache as an unpruned run."""
    tokens = prompt(model)
    outs = []
    for prune in (True, False):
        ctx = Context(model, ContextParams(n_ctx=64, prune=prune))
        ctx.decode(Batch.for_sequence(tokens[:12], logits="none"))
        outs.append(ctx.decode(Batch.for_sequence(tokens[12:], start_pos=12)))
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-6)

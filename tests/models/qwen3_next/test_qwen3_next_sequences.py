"""Qwen3-Next's recurrent states through the context's sequence operations, checked against
transformers (each sequence alone, from its first token).

Sequences in one batch keep their states apart; a copied sequence continues like its
source; removal is refused where it would cut into a state (the state and the cache are
then unchanged) and allowed for a whole sequence or past its end; a ubatch that does not
continue a state right where it ends is refused; a saved sequence restores into another
context (and another sequence id) and continues identically; the prompt cache reuses a
stored state only for an exact prefix and otherwise evaluates the prompt again
(speculative decoding: test_qwen3_next_speculative.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from qwen3_next_oracle import (
    BACKENDS,
    LLAMA_CPP_F32,
    N_PREDICT,
    RUNTIME,
    TOL,
    context,
    greedy,
    hf_model,
    prompt,
    transformers_answers,
)

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import TesseraError
from tessera.files.load import load_model


def hf_logits(tokens: list[int]) -> np.ndarray:
    with torch.no_grad():
        return hf_model()(torch.tensor(tokens)[None]).logits[0].numpy()


@pytest.mark.parametrize("stacked", ["1", "0"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_sequences_in_one_batch_give_what_each_gives_alone(backend, stacked, monkeypatch):
    """Prefill rows of both sequences in each ubatch, then decode steps of both at once:
    side by side in one call per op (TESSERA_QWEN3NEXT_STACKED_DECODE) or one by one."""
    monkeypatch.setenv("TESSERA_QWEN3NEXT_STACKED_DECODE", stacked)
    a, b = prompt(7).tolist(), prompt(8, 11).tolist()
    model = load_model(LLAMA_CPP_F32, RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))
    ctx = Context(model, ContextParams(n_ctx=64, n_seq_max=2, n_ubatch=7))
    assert model.graph.delta_net.stacked_decode is (stacked == "1")
    # interleaved rows: each ubatch holds rows of both sequences
    rows = sorted(
        [(i, 0, t) for i, t in enumerate(a)] + [(i, 1, t) for i, t in enumerate(b)],
        key=lambda r: (r[0], r[1]),
    )
    batch = Batch([t for _, _, t in rows], [p for p, _, _ in rows], [s for _, s, _ in rows],
                  np.ones(len(rows), bool))  # fmt: skip
    logits = ctx.decode(batch)
    seqs = np.array([s for _, s, _ in rows])
    assert np.abs(logits[seqs == 0] - hf_logits(a)).max() < TOL
    assert np.abs(logits[seqs == 1] - hf_logits(b)).max() < TOL
    # two decode steps of both sequences at once (the conv state shifts through both)
    for step, (ta, tb) in enumerate([(5, 9), (6, 2)]):
        both = ctx.decode(Batch([ta, tb], [len(a), len(b)], [0, 1], [True, True]))
        a, b = [*a, ta], [*b, tb]
        assert np.abs(both[0] - hf_logits(a)[-1]).max() < TOL, step
        assert np.abs(both[1] - hf_logits(b)[-1]).max() < TOL, step


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_copied_sequence_continues_like_its_source(backend):
    a = prompt().tolist()
    ctx = context(LLAMA_CPP_F32, backend, n_seq_max=2)
    ctx.decode(Batch.for_sequence(a))
    assert ctx.kv.seq_cp(0, 1) is True
    assert ctx.recurrent.pos[1] == len(a) - 1
    out = ctx.decode(Batch([3, 4], [len(a), len(a)], [0, 1], [True, True]))
    assert np.abs(out[0] - hf_logits([*a, 3])[-1]).max() < TOL
    assert np.abs(out[1] - hf_logits([*a, 4])[-1]).max() < TOL
    # a part of a state cannot be copied, nor onto a sequence that has one
    assert ctx.kv.seq_cp(0, 1, 0, 5) is False
    assert ctx.kv.seq_cp(0, 1) is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_removal_cutting_into_a_state_is_refused_and_changes_nothing(backend):
    a = prompt().tolist()
    ctx = context(LLAMA_CPP_F32, backend)
    ctx.decode(Batch.for_sequence(a))
    used = ctx.kv.n_used
    assert ctx.kv.seq_rm(0, 5) is False
    assert ctx.kv.seq_rm(0, 2, 4) is False
    assert ctx.kv.n_used == used and ctx.recurrent.pos[0] == len(a) - 1
    assert ctx.kv.seq_rm(0, len(a)) is True  # past the end: nothing to remove
    out = ctx.decode(Batch.for_sequence([3], len(a)))
    assert np.abs(out[0] - hf_logits([*a, 3])[-1]).max() < TOL
    assert ctx.kv.seq_rm(0) is True  # the whole sequence
    assert ctx.kv.n_used == 0 and ctx.recurrent.pos[0] == -1
    again = ctx.decode(Batch.for_sequence(a, logits="all"))
    assert np.abs(again - hf_logits(a)).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_ubatch_that_does_not_continue_the_state_is_refused(backend):
    a = prompt().tolist()
    ctx = context(LLAMA_CPP_F32, backend)
    ctx.decode(Batch.for_sequence(a))
    with pytest.raises(TesseraError, match="recurrent state ends at position 15.*position 0"):
        ctx.decode(Batch.for_sequence([3, 4], 10))
    out = ctx.decode(Batch.for_sequence([3], len(a)))  # nothing of the refused batch stayed
    assert np.abs(out[0] - hf_logits([*a, 3])[-1]).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_sequence_restores_and_continues_identically(backend, tmp_path):
    a = prompt().tolist()
    ctx = context(LLAMA_CPP_F32, backend, n_ubatch=6)
    ctx.decode(Batch.for_sequence(a[:-1], logits="none"))
    ctx.save_state(tmp_path / "s.bin", 0, a[:-1])
    want = greedy(ctx, a, n_past=len(a) - 1)
    assert want == transformers_answers()[1]
    other = context(LLAMA_CPP_F32, backend, n_seq_max=2)
    assert other.load_state(tmp_path / "s.bin", 1) == a[:-1]
    assert other.recurrent.pos[1] == len(a) - 2
    assert greedy(other, a, seq_id=1, n_past=len(a) - 1) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_prompt_cache_reuses_only_an_exact_prefix_of_the_stored_state(backend):
    a = prompt().tolist()
    ctx = context(LLAMA_CPP_F32, backend)
    first = greedy(ctx, a)
    # the cache holds all but the last sampled token: exactly the prefix before it
    longer = [*a, *first]
    stats = GenerationStats()
    sampler = Sampler(SamplerParams(temperature=0))
    got = list(generate(ctx, longer, N_PREDICT, sampler, n_past=len(longer) - 1, stats=stats))
    assert stats.n_prompt == 1  # the state held the whole prefix: one token evaluated
    with torch.no_grad():
        ids = torch.tensor(longer)[None]
        out = hf_model().generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    assert got == out[0, len(longer) :].tolist()
    # a shorter prefix cannot be cut out of the state: the prompt is evaluated again
    stats = GenerationStats()
    sampler = Sampler(SamplerParams(temperature=0))
    again = list(generate(ctx, a, N_PREDICT, sampler, n_past=len(a) - 4, stats=stats))
    assert stats.n_prompt == len(a) and again == first


def test_states_stay_float32_on_a_bf16_backend_and_restore_identically(tmp_path):
    """llama.cpp keeps recurrent states in float32; so does tessera whatever the compute
    dtype, and a bf16 context's saved state continues exactly as the uninterrupted run."""
    model = load_model(LLAMA_CPP_F32, RUNTIME, RUNTIME.create_backend("torch", dtype="bf16"))
    a = prompt().tolist()
    ctx = Context(model, ContextParams(n_ctx=64))
    assert {t.dtype for t in ctx.recurrent.tensors()} == {torch.float32}
    ctx.decode(Batch.for_sequence(a[:-1], logits="none"))
    ctx.save_state(tmp_path / "s.bin", 0, a[:-1])
    want = greedy(ctx, a, n_past=len(a) - 1)
    other = Context(model, ContextParams(n_ctx=64))
    other.load_state(tmp_path / "s.bin", 0)
    assert greedy(other, a, n_past=len(a) - 1) == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_carry_the_states_across_ubatches_and_leave_them_as_they_were(backend):
    a, b = prompt(7).tolist(), prompt(8, 11).tolist()
    ctx = context(LLAMA_CPP_F32, backend, n_seq_max=3, n_ubatch=5)
    ctx.decode(Batch.for_sequence(a[:4], 0, 2))  # a third sequence, which must not move
    batch = Batch.concat([Batch.for_sequence(a, 0, 0, "all"), Batch.for_sequence(b, 0, 1, "all")])
    pooled = ctx.encode(batch, pooling="mean")
    with torch.no_grad():
        for row, tokens in zip(pooled, (a, b), strict=True):
            hidden = hf_model().model(torch.tensor(tokens)[None]).last_hidden_state[0]
            assert np.abs(row - hidden.numpy().mean(0)).max() < TOL
    assert list(ctx.recurrent.pos) == [-1, -1, 3]
    out = ctx.decode(Batch.for_sequence([a[4]], 4, 2))
    assert np.abs(out[0] - hf_logits(a[:5])[-1]).max() < TOL

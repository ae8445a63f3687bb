"""Speculative decoding on Qwen3-Next: rejected drafts are rolled out of the recurrent
states too, so greedy speculative output is transformers' greedy output.

A verify batch folds every drafted row into the gated delta net's state; after a rejection
the state is restored and the kept rows evaluated again
(:mod:`tessera.engine.draft_rollback`). A scripted drafter proposes transformers' own
continuation with chosen tokens made wrong, so steps accept all, some or none of a draft;
the oracle is transformers' ``generate`` on the committed folder, and the states left
behind are compared with those of plain decoding.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import pytest
import torch
from qwen3_next_oracle import (
    BACKENDS,
    DATA,
    LLAMA_CPP_F32,
    RUNTIME,
    ScriptedDrafter,
    context,
    greedy,
    hf_model,
    prompt,
)

from tessera.contract.spec import SpecParams
from tessera.engine.drafting import create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.testing.commands import registered_command

N_NEW = 14


@functools.cache
def transformers_greedy() -> list[int]:
    ids = torch.tensor(prompt())[None]
    with torch.no_grad():
        out = hf_model().generate(ids, max_new_tokens=N_NEW, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


def run(ctx, tokens, decoder=None, spec=None) -> tuple[list[int], GenerationStats]:
    stats = GenerationStats()
    sampler = Sampler(SamplerParams(temperature=0))
    out = list(generate(ctx, tokens, N_NEW, sampler, decoder=decoder, spec=spec, stats=stats))
    return out, stats


def states(ctx) -> list[np.ndarray]:
    return [np.asarray(ctx.model.backend.to_numpy(t[0:1])) for t in ctx.recurrent.tensors()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_speculation_through_rejections_gives_transformers_tokens(backend):
    want = transformers_greedy()
    p = prompt().tolist()
    plain_ctx = context(LLAMA_CPP_F32, backend)
    plain, _ = run(plain_ctx, p)
    ctx = context(LLAMA_CPP_F32, backend)
    drafter = ScriptedDrafter([p + want], ctx.model.config.n_vocab)
    got, stats = run(ctx, p, drafter, SpecParams(draft_max=3, adaptive=False))
    assert plain == want
    assert got == want
    # the script's steps accepted whole drafts and cut others short
    assert 0 < stats.n_accepted < stats.n_drafted and stats.n_verify >= 5
    assert stats.n_target_batches < N_NEW - 1  # fewer target batches than plain decoding
    # the states hold exactly what plain decoding folded in
    assert ctx.recurrent.pos[0] == plain_ctx.recurrent.pos[0] == len(p) + N_NEW - 2
    for s, t in zip(states(ctx), states(plain_ctx), strict=True):
        np.testing.assert_allclose(s, t, atol=1e-5)


def test_qwen3next_as_a_draft_model_follows_accepted_and_rejected_drafts():
    """The draft model's own state cannot be cut back either: after each history it is
    saved and put back for the next one, which then drafts as a fresh context would."""
    ctx = context(LLAMA_CPP_F32, "numpy")
    params = SpecParams(model_draft=str(LLAMA_CPP_F32), p_min=0.0)
    decoder = create_decoder(RUNTIME, "draft", ctx, params)
    p = prompt().tolist()
    first = decoder.draft(p, 3).tokens
    rejected = [*p, (first[0] + 1) % ctx.model.config.n_vocab]  # none of the draft kept
    second = decoder.draft(rejected, 3).tokens
    cut_short = [*rejected, second[0], (second[1] + 1) % ctx.model.config.n_vocab]
    histories = [p, rejected, cut_short, prompt(8).tolist()]  # the last starts over
    drafts = [
        first,
        second,
        decoder.draft(cut_short, 3).tokens,
        decoder.draft(histories[3], 3).tokens,
    ]
    decoder.close()
    for history, draft in zip(histories, drafts, strict=True):
        assert list(draft) == greedy(context(LLAMA_CPP_F32, "numpy"), history)[:3]


def test_tessera_run_with_a_recurrent_draft_model_prints_what_plain_run_prints(capsys):
    """End to end: the YaRN variant (same weights, other RoPE) drafts for the plain model,
    so drafts are accepted and rejected and both models' states are rolled back."""
    command = registered_command("tessera.plugins.cmd.run", "run")
    parser = argparse.ArgumentParser(prog="tessera run")
    command.add_arguments(parser)
    base = ["-m", str(LLAMA_CPP_F32), "-p", "def f(x): return x", "-n", "40", "--temp", "0"]
    draft = ["--spec-type", "draft", "-md", str(DATA / "qwen3next-yarn-f32.gguf")]
    outs = []
    for extra in ([], [*draft, "--draft-p-min", "0", "--no-spec-adaptive"]):
        assert command.run(parser.parse_args([*base, "--backend", "numpy", *extra]), RUNTIME) == 0
        captured = capsys.readouterr()
        outs.append(captured.out)
    assert outs[0] == outs[1]
    counters = captured.err.split("speculative (draft): drafted ")[1].split()
    drafted, accepted = int(counters[0].rstrip(",")), int(counters[2])
    assert 0 < accepted < drafted

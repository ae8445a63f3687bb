"""The n-gram, draft and select spec decoders on their own, and `tessera run --spec-type`."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tessera.contract.spec import SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.errors import TesseraError
from tessera.files.gguf import read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.spec.ngram import ngram_candidates
from tessera.plugins.spec.select import expected_accepted
from tessera.testing.commands import registered_command
from tessera.testing.models import make_gguf


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def target(tmp_path_factory, runtime):
    return make_gguf(tmp_path_factory.mktemp("t") / "t.gguf", seed=5, runtime=runtime)


def test_ngram_prefers_the_longest_then_the_latest_match():
    h = [1, 2, 3, 9, 9, 5, 2, 3, 7, 7, 1, 2, 3]
    # "1 2 3" occurred at 0 (followed by 9 9 5); "2 3" also at 6 (followed by 7 7)
    assert ngram_candidates(h, 3, 3) == [(9, 9, 5), (7, 7, 1)]
    assert ngram_candidates(h, 2, 1) == [(9, 9)]
    assert ngram_candidates([4, 5, 6], 4, 1) == []
    assert ngram_candidates(h, 0, 1) == []


def test_expected_accepted_length():
    assert expected_accepted([]) == 0.0
    assert expected_accepted([1.0, 1.0]) == 2.0
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)


def test_draft_model_drafts_the_target_greedy_chain(target, runtime):
    """With the target as its own draft, the draft is the greedy continuation."""
    from tessera.engine.generate import generate
    from tessera.engine.sampling import Sampler, SamplerParams

    model = load_model(target, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=64))
    prompt = [10, 20, 30, 40]
    want = list(generate(ctx, prompt, 6, Sampler(SamplerParams(temperature=0))))
    params = SpecParams(model_draft=str(target), p_min=0.0)
    decoder = create_decoder(runtime, "draft", ctx, params)
    assert decoder.draft([*prompt, want[0]], 5).tokens == tuple(want[1:6])
    # the draft cache follows a changed history: only the changed tail is evaluated again
    assert decoder.draft([*prompt, want[0]], 3).tokens == tuple(want[1:4])
    with pytest.raises(TesseraError, match="p_min"):
        SpecParams(p_min=-0.1)
    # --spec-draft-n-ubatch sets the draft context's ubatch on its own
    small = create_decoder(
        runtime, "draft", ctx, SpecParams(model_draft=str(target), n_ubatch_draft=3, p_min=0.0)
    )
    assert small.ctx.n_ubatch == 3 and ctx.n_ubatch != 3
    assert small.draft([*prompt, want[0]], 2).tokens == tuple(want[1:3])


def test_draft_refuses_another_vocabulary(target, runtime, tmp_path):
    src = read_gguf(target)
    meta = dict(src.metadata)
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[7], tokens[8] = tokens[8], tokens[7]
    meta["tokenizer.ggml.tokens"] = tokens
    other = write_gguf(tmp_path / "other.gguf", meta, list(src.tensors.values()))
    ctx = Context(load_model(target, runtime, "numpy"), ContextParams(n_ctx=32))
    with pytest.raises(TesseraError, match="another vocabulary.*token 7 differs"):
        create_decoder(runtime, "draft", ctx, SpecParams(model_draft=str(other)))


def test_draft_needs_a_model(tmp_path, runtime):
    plain = make_gguf(tmp_path / "x.gguf", seed=1, runtime=runtime)
    ctx = Context(load_model(plain, runtime, "numpy"), ContextParams(n_ctx=32))
    with pytest.raises(TesseraError, match="pass -md FILE"):
        create_decoder(runtime, "draft", ctx, SpecParams())


def test_select_scores_candidates_with_the_draft_model(target, runtime):
    """Candidates are scored in one multi-sequence batch of the draft model; each score is
    the expected accepted length from the draft's probabilities, which a fresh context
    evaluating each candidate on its own reproduces. No candidate cells stay behind."""
    from tessera.engine.batch import Batch
    from tessera.plugins.spec.draft import softmax

    model = load_model(target, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=64))
    decoder = create_decoder(runtime, "select", ctx, SpecParams(model_draft=str(target), p_min=0.0))
    history = [3, 4, 5, 6, 7, 3, 4, 5]
    decoder.begin(history, 0)
    draft = decoder.draft(history, 4)
    assert 1 <= len(draft) <= 4 and sum(decoder.wins.values()) == 1
    cands = [("ngram", (6, 7, 3, 4)), ("other", (9, 1, 2))]
    scores = decoder._score(history, cands)
    seqs = decoder.drafter.ctx.kv.seqs
    assert not (seqs & ~np.uint64(1)).any()  # only sequence 0 (history + drafts) holds cells
    oracle = Context(model, ContextParams(n_ctx=64))
    for (_, cand), score in zip(cands, scores, strict=True):
        oracle.kv.clear()
        rows = oracle.decode(Batch.for_sequence([*history, *cand[:-1]], 0, 0, "all"))
        probs = [softmax(rows[len(history) - 1 + j])[t] for j, t in enumerate(cand)]
        assert score == pytest.approx(expected_accepted(probs), rel=1e-4)


def test_run_command_with_spec_type(target, runtime, capsys):
    """`tessera run` prints the same text with and without speculation, plus the stats."""
    command = registered_command("tessera.plugins.cmd.run", "run")
    parser = argparse.ArgumentParser(prog="tessera run")
    command.add_arguments(parser)
    base = ["-m", str(target), "-p", "a b a b a b", "-n", "24", "--temp", "0"]
    outs = []
    for extra in ([], ["--spec-type", "ngram"], ["-md", str(target), "--draft-max", "4"]):
        args = parser.parse_args([*base, "--backend", "numpy", *extra])
        assert command.run(args, runtime) == 0
        captured = capsys.readouterr()
        outs.append(captured.out)
        if extra:
            assert "speculative (" in captured.err and "accepted" in captured.err
    assert outs[0] == outs[1] == outs[2]
    args = parser.parse_args([*base, "--spec-type", "medusa"])
    with pytest.raises(TesseraError, match="installed types are: draft, mtp, ngram, select"):
        command.run(args, runtime)

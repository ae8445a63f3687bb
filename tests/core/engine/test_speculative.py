"""Speculative generation: identical greedy output, the target's sampling distribution, and
a KV cache left exactly as plain decoding leaves it — for every installed spec type and for
a scripted drafter that forces the edge cases (EOG inside a draft, the context limit)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from tessera.contract.spec import Draft, SpecDecoder, SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import DraftLength, create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.engine.verify import accept_draft
from tessera.errors import TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf

GREEDY = SamplerParams(temperature=0.0)


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def files(tmp_path_factory, runtime):
    d = tmp_path_factory.mktemp("spec")
    return {
        # the target carries one MTP (nextn) block so every spec type can run on it
        "target": make_gguf(d / "target.gguf", n_nextn=1, seed=11, runtime=runtime),
        "draft": make_gguf(d / "draft.gguf", n_layer=1, seed=12, runtime=runtime),
    }


@pytest.fixture(scope="module")
def model(files, runtime):
    return load_model(files["target"], runtime, "numpy")


def prompts(n_vocab: int, count: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        base = [int(t) for t in rng.integers(3, n_vocab, 3 + i % 4)]
        out.append(base * (1 + i % 3))  # repeats give the n-gram drafter something to find
    return out


def plain_tokens(ctx, prompt, n, **kw):
    return list(generate(ctx, prompt, n, Sampler(GREEDY), **kw))


# -- greedy identity -----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec_type, draft_file",
    [
        ("draft", "target"),
        ("draft", "draft"),
        ("select", "target"),
        ("select", "draft"),
        ("ngram", None),
        ("mtp", None),
    ],
)
def test_greedy_output_equals_plain_decoding(spec_type, draft_file, files, model, runtime):
    """Drafting with the target itself (everything accepted) and with an unrelated random
    model (almost nothing accepted) both give exactly the plain greedy tokens; so do the
    n-gram lookup and the target's own (random) MTP block."""
    ctx = Context(model, ContextParams(n_ctx=96))
    draft = str(files[draft_file]) if draft_file else None
    # Not adaptive: every step carries a draft (the governor would rightly stop drafting
    # with the target as its own drafter, which costs more than it saves).
    params = SpecParams(model_draft=draft, draft_max=5, p_min=0.0, adaptive=False)
    decoder = create_decoder(runtime, spec_type, ctx, params)
    accepted = 0
    for i, prompt in enumerate(prompts(model.n_vocab, 6)):
        n = (7, 20, 33)[i % 3]
        want = plain_tokens(ctx, prompt, n)
        stats = GenerationStats()
        got = list(
            generate(ctx, prompt, n, Sampler(GREEDY), decoder=decoder, spec=params, stats=stats)
        )
        assert got == want, f"prompt {i}"
        assert stats.n_generated == len(want)
        accepted += stats.n_accepted
    decoder.close()
    if draft_file == "target" and spec_type in ("draft", "select"):
        assert accepted > 50  # the target drafting for itself is accepted


class ScriptedDrafter(SpecDecoder):
    """Proposes the known plain continuation, wrong at every ``wrong``-th draft position."""

    def __init__(self, script, wrong=0, n_prompt=0):
        self.script, self.wrong, self.n_prompt = list(script), wrong, n_prompt
        self.calls = 0

    def draft(self, history, n_max):
        self.calls += 1
        at = len(history) - self.n_prompt
        tokens = list(self.script[at : at + n_max])
        if self.wrong and tokens and self.calls % self.wrong == 0:
            k = len(tokens) // 2
            tokens[k] = (tokens[k] + 1) % 256
        return Draft(tokens)


def test_eog_inside_a_draft_stops_like_plain_decoding(model):
    ctx = Context(model, ContextParams(n_ctx=96))
    prompt = prompts(model.n_vocab, 1, seed=3)[0]
    full = plain_tokens(ctx, prompt, 40)
    eog = frozenset({full[17]})  # an end-of-generation token the drafter proposes past
    want = plain_tokens(ctx, prompt, 40, eog_ids=eog)
    assert len(want) == full.index(full[17]) and len(want) < 40
    kv_plain = (ctx.kv.pos.copy(), ctx.kv.seqs.copy())
    # the drafter knows the text beyond the EOG token and proposes all of it
    drafter = ScriptedDrafter([*full, *full], n_prompt=len(prompt))
    stats = GenerationStats()
    got = list(
        generate(
            ctx,
            prompt,
            40,
            Sampler(GREEDY),
            decoder=drafter,
            spec=SpecParams(draft_max=8),
            eog_ids=eog,
            stats=stats,
        )
    )
    assert got == want
    assert stats.n_accepted > 0
    np.testing.assert_array_equal(ctx.kv.pos, kv_plain[0])
    np.testing.assert_array_equal(ctx.kv.seqs, kv_plain[1])


@pytest.mark.parametrize("wrong", [0, 2])
def test_drafts_up_to_the_context_limit(model, wrong):
    """n_predict -1 runs to the end of the context; drafts are cut to fit it."""
    ctx = Context(model, ContextParams(n_ctx=40))
    prompt = prompts(model.n_vocab, 2, seed=5)[1]
    want = plain_tokens(ctx, prompt, -1)
    assert len(want) == 40 - len(prompt)
    drafter = ScriptedDrafter([*want, *want], wrong=wrong, n_prompt=len(prompt))
    got = list(
        generate(ctx, prompt, -1, Sampler(GREEDY), decoder=drafter, spec=SpecParams(draft_max=16))
    )
    assert got == want


# -- the KV cache after rollback -------------------------------------------------------


@pytest.mark.parametrize("spec_type", ["draft", "mtp", "select"])
def test_rollback_leaves_the_cache_as_plain_decoding(spec_type, files, model, runtime):
    """Same cells, positions and sequences; the same K/V in every used cell (up to float
    rounding of a batched vs single-row matmul)."""
    prompt = prompts(model.n_vocab, 3, seed=9)[2]
    plain = Context(model, ContextParams(n_ctx=64))
    plain_tokens(plain, prompt, 30)
    ctx = Context(model, ContextParams(n_ctx=64))
    # a draft that is partly right: the target's own greedy chain cut short by p_min
    params = SpecParams(model_draft=str(files["target"]), draft_max=6, p_min=0.0)
    decoder = create_decoder(runtime, spec_type, ctx, params)
    list(generate(ctx, prompt, 30, Sampler(GREEDY), decoder=decoder, spec=params))
    np.testing.assert_array_equal(ctx.kv.pos, plain.kv.pos)
    np.testing.assert_array_equal(ctx.kv.seqs, plain.kv.seqs)
    used = np.flatnonzero(plain.kv.seqs)
    for a, b in zip(ctx.kv.k + ctx.kv.v, plain.kv.k + plain.kv.v, strict=True):
        np.testing.assert_allclose(np.asarray(a)[used], np.asarray(b)[used], atol=1e-4)


def test_rollback_with_scripted_rejections(model):
    prompt = prompts(model.n_vocab, 1, seed=13)[0]
    plain = Context(model, ContextParams(n_ctx=64))
    want = plain_tokens(plain, prompt, 25)
    ctx = Context(model, ContextParams(n_ctx=64))
    drafter = ScriptedDrafter(want, wrong=1, n_prompt=len(prompt))  # every draft half wrong
    stats = GenerationStats()
    got = list(
        generate(
            ctx,
            prompt,
            25,
            Sampler(GREEDY),
            decoder=drafter,
            spec=SpecParams(draft_max=6, adaptive=False),
            stats=stats,
        )
    )
    assert got == want
    assert 0 < stats.n_accepted < stats.n_drafted  # both the accept and the reject path ran
    np.testing.assert_array_equal(ctx.kv.pos, plain.kv.pos)
    np.testing.assert_array_equal(ctx.kv.seqs, plain.kv.seqs)


# -- sampling: the rejection rule keeps the target's distribution -----------------------


def chi2_critical(df: int, z: float = 3.0902) -> float:
    """Upper 0.1% point of chi-square(df) (Wilson-Hilferty; z = the normal 0.999 quantile)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts: Counter, expected: dict) -> tuple[float, int]:
    n = sum(counts.values())
    assert set(counts) <= set(expected), "a token the target gives probability 0 came out"
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items())
    return stat, len(expected) - 1


def test_rejection_rule_reproduces_the_target_distribution():
    """accept_draft with a sampled proposal q != p: the emitted first token ~ p.

    Chi-square goodness of fit at the 0.1% level: with a fixed seed the test is
    deterministic; for a random seed a correct rule fails it with probability 0.001.
    """
    rng = np.random.default_rng(7)
    n_vocab = 8
    logits = rng.normal(size=n_vocab).astype(np.float32)
    sampler = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1))
    p = sampler.probs(logits)
    q = rng.dirichlet(np.ones(n_vocab))  # a poor proposal: acceptance ~ sum(min(p, q))
    rows = np.stack([logits, logits])
    counts: Counter = Counter()
    for _ in range(8000):
        d = int(sampler.rng.choice(n_vocab, p=q))
        counts[accept_draft(Draft([d], q[None, :]), rows, sampler, [])[0]] += 1
    stat, df = chi2_stat(counts, {i: float(p[i]) for i in range(n_vocab)})
    assert stat < chi2_critical(df)


def test_sampled_tokens_follow_the_target_distribution(files, model, runtime):
    """Three sampled tokens (top-k 2, so 8 outcomes) with speculation vs their exact
    probability from the target alone (products of Sampler.probs over plain decodes).
    Chi-square at the 0.1% level, 600 runs with a fixed seed: deterministic, and a correct
    implementation fails for a random seed with probability 0.001."""
    sp = SamplerParams(temperature=1.5, top_k=2, top_p=1.0, min_p=0.0, seed=2024)
    prompt = prompts(model.n_vocab, 1, seed=21)[0]
    ctx = Context(model, ContextParams(n_ctx=32))
    oracle = Sampler(sp)
    from tessera.engine.batch import Batch

    def dist(seq):
        ctx.kv.clear()
        logits = ctx.decode(Batch.for_sequence(seq, 0, 0, "last"))[-1]
        return oracle.probs(logits, seq)

    expected = {}
    p1 = dist(prompt)
    for a in np.flatnonzero(p1):
        p2 = dist([*prompt, int(a)])
        for b in np.flatnonzero(p2):
            p3 = dist([*prompt, int(a), int(b)])
            for c in np.flatnonzero(p3):
                expected[(int(a), int(b), int(c))] = float(p1[a] * p2[b] * p3[c])
    params = SpecParams(model_draft=str(files["target"]), draft_max=2, p_min=0.0, adaptive=False)
    decoder = create_decoder(runtime, "draft", ctx, params)
    sampler = Sampler(sp)
    counts: Counter = Counter()
    stats = GenerationStats()
    for _ in range(600):
        out = tuple(generate(ctx, prompt, 3, sampler, decoder=decoder, spec=params, stats=stats))
        counts[out] += 1
    assert 0 < stats.n_accepted < stats.n_drafted  # drafts were both kept and rejected
    stat, df = chi2_stat(counts, expected)
    assert stat < chi2_critical(df)


# -- pieces and errors -------------------------------------------------------------------


def test_draft_length_adapts_and_can_be_fixed():
    length = DraftLength(8)
    assert length.next() == 8
    length.update(8, 2)
    assert length.next() == 3
    length.update(3, 3)
    assert length.next() == 6
    length.n = 1
    length.update(1, 0)  # a total miss at length 1 pauses drafting for one step
    assert length.next() == 0 and length.next() == 1
    fixed = DraftLength(8, adaptive=False)
    fixed.update(8, 0)
    assert fixed.next() == 8


@pytest.mark.parametrize(("fixed_by", "seed"), [("switch", 4), ("cheap_drafts", 6)])
def test_a_fixed_draft_length_gives_the_same_tokens(model, monkeypatch, fixed_by, seed):
    """With TESSERA_SPEC_ADAPTIVE=0, or for a lookup drafter (cheap_drafts: shrinking would
    only save drafting work, which costs it nothing), every draft asks for --draft-max
    tokens, and the tokens are the target's own."""
    ctx = Context(model, ContextParams(n_ctx=64))
    prompt = prompts(model.n_vocab, 1, seed=seed)[0]
    want = plain_tokens(ctx, prompt, 20)
    drafter = ScriptedDrafter(want, wrong=1, n_prompt=len(prompt))
    if fixed_by == "switch":
        monkeypatch.setenv("TESSERA_SPEC_ADAPTIVE", "0")
    else:
        drafter.cheap_drafts = True
    stats = GenerationStats()
    got = list(
        generate(
            ctx,
            prompt,
            20,
            Sampler(GREEDY),
            decoder=drafter,
            spec=SpecParams(draft_max=4),
            stats=stats,
        )
    )
    assert got == want
    assert stats.n_drafted >= 4 * (stats.n_verify - 1)  # the length stayed at draft_max


def test_unknown_spec_type_lists_the_installed_ones(runtime):
    with pytest.raises(TesseraError, match="installed types are: draft, mtp, ngram, select"):
        runtime.spec_decoder("eagle")


def test_mtp_refuses_a_model_without_nextn_layers(files, runtime, tmp_path):
    plain = load_model(make_gguf(tmp_path / "p.gguf", runtime=runtime), runtime, "numpy")
    with pytest.raises(TesseraError, match="no MTP layers.*nextn_predict_layers"):
        create_decoder(runtime, "mtp", Context(plain, ContextParams(n_ctx=32)), SpecParams())


def test_spec_params_validate():
    with pytest.raises(TesseraError, match="draft-min"):
        SpecParams(draft_max=2, draft_min=3)
    with pytest.raises(TesseraError, match="p_min"):
        SpecParams(p_min=1.5)

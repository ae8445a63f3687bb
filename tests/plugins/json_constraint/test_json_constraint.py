"""JSON-constrained sampling: masks against token-by-token checks, outputs against json.loads,
and the sampled distribution against the masked distribution computed directly."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest

from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import TesseraError
from tessera.files.load import default_model_path
from tessera.plugins.json_constraint.constraint import JsonConstraintFactory
from tessera.text.tokenizer import Tokenizer

CHAINS = {
    "plain": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "default": SamplerParams(),
    "top-k": SamplerParams(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0),
    "top-k-top-p-min-p": SamplerParams(temperature=1.3, top_k=5, top_p=0.8, min_p=0.05),
    "min-p": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
    "top-p": SamplerParams(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0),
    "penalty": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.5),
}


@attrs.define
class ByteVocab:
    """A tokenizer stand-in over explicit byte strings; the last token is end-of-generation."""

    pieces: list[bytes]

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    def token_to_bytes(self, i: int) -> bytes:
        return self.pieces[i]

    def is_eog(self, i: int) -> bool:
        return i == len(self.pieces) - 1

    def is_special(self, i: int) -> bool:
        return self.is_eog(i)


# Tokens that pop two or three containers at once exercise the mask cache's stack handling.
SMALL = ByteVocab(
    [b"{", b"}", b'"', b"a", b'"a"', b":", b"1", b",", b" ", b"x", b"]]}", b"]}", b"}]}"]
    + [b"[", b'"b', b"]]", b"\xc3", b"\xa9", b'"]]}', b'a"', b"", b"<eog>"]
)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_path(default_model_path())


@pytest.fixture(scope="module")
def factory(tokenizer):
    return JsonConstraintFactory(tokenizer)


def brute_mask(constraint) -> np.ndarray:
    return np.array([constraint.allows(i) for i in range(constraint.factory.n_vocab)])


def closing_bias(factory) -> np.ndarray:
    """Random logits rarely close a string; this nudges them so runs end in time."""
    bias = np.zeros(factory.n_vocab, dtype=np.float32)
    for i, data in enumerate(factory.token_bytes):
        if data and any(c in data for c in b'"}]'):
            bias[i] = 3.0
    return bias


@pytest.mark.parametrize("vector_strings", [True, False], ids=["string-scan", "trie-only"])
def test_allowed_mask_matches_token_by_token_checks_along_real_documents(tokenizer, vector_strings):
    doc = {"a": [1, -2.5e-3, True, None, {"b": [[["deep"]]]}], "é€😀": "x\ny\u0001", "n": {}}
    runs = [(0, json.dumps(doc)), (256, json.dumps(doc, ensure_ascii=False, indent=1))]
    for cache_size, text in runs:
        factory = JsonConstraintFactory(
            tokenizer, mask_cache_size=cache_size, vector_strings=vector_strings
        )
        constraint = factory.new()
        for token in tokenizer.encode(text, add_special=False):
            np.testing.assert_array_equal(constraint.allowed_mask(), brute_mask(constraint))
            constraint.accept(token)
        assert constraint.complete
        np.testing.assert_array_equal(constraint.allowed_mask(), factory.eog)


@pytest.mark.parametrize("vector_strings", [True, False], ids=["string-scan", "trie-only"])
@pytest.mark.parametrize("inside", [b"1", b'"a'], ids=["after-number", "in-string"])
def test_the_mask_cache_checks_tokens_that_pop_below_the_cached_stack(inside, vector_strings):
    factory = JsonConstraintFactory(SMALL, vector_strings=vector_strings)
    closers = SMALL.pieces.index(b'"]]}' if inside == b'"a' else b"]]}")
    # Equal keys (top of the stack "[[", more below), different containers under them.
    outcomes = []
    for prefix in (b'{"a":[[[', b'{"a":{"a":[[', b'{"a":[{"a":[[', b'{"a":[['):
        constraint = factory.new()
        assert constraint.state.feed(prefix + inside)
        np.testing.assert_array_equal(constraint.allowed_mask(), brute_mask(constraint))
        outcomes.append(bool(constraint.allowed_mask()[closers]))
    assert outcomes == [False, True, True, True]  # the last one closes the document
    assert len(factory._masks) == 1  # all four share one cached entry


def test_eog_only_when_complete_and_only_eog_then(factory, tokenizer):
    constraint = factory.new()
    eog = sorted(tokenizer.eog_ids)
    assert not any(constraint.allows(i) for i in eog)
    for token in tokenizer.encode('{"a": 1}', add_special=False):
        constraint.accept(token)
    assert constraint.complete
    np.testing.assert_array_equal(np.flatnonzero(brute_mask(constraint)), eog)
    with pytest.raises(TesseraError, match="cannot continue the JSON"):
        constraint.accept(tokenizer.encode(" ", add_special=False)[0])
    constraint.accept(eog[0])
    assert constraint.finished and not brute_mask(constraint).any()


def test_special_and_empty_tokens_are_never_allowed():
    factory = JsonConstraintFactory(SMALL)
    constraint = factory.new()
    constraint.accept(0)  # "{"
    constraint.accept(2)  # '"' opens a key, where any text byte fits
    assert not constraint.allows(SMALL.pieces.index(b""))
    assert not constraint.allows(len(SMALL.pieces) - 1)
    assert constraint.allows(SMALL.pieces.index(b"\xc3"))
    constraint.accept(SMALL.pieces.index(b"\xc3"))
    assert not constraint.allows(SMALL.pieces.index(b'"'))  # would cut a character in half
    assert constraint.allows(SMALL.pieces.index(b"\xa9"))


@pytest.mark.parametrize("rejection", [True, False], ids=["rejection", "mask"])
@pytest.mark.parametrize("chain", CHAINS)
def test_sampled_outputs_are_json_objects(tokenizer, chain, rejection):
    factory = JsonConstraintFactory(tokenizer, rejection=rejection)
    bias = closing_bias(factory)
    rng = np.random.default_rng(7)
    for seed in range(6):
        sampler = Sampler(attrs.evolve(CHAINS[chain], seed=seed))
        constraint, out = factory.new(), []
        while not constraint.finished:
            assert len(out) < 2000
            logits = rng.normal(scale=2.0, size=factory.n_vocab).astype(np.float32) + bias
            token = constraint.sample(sampler, logits, out)
            assert constraint.allows(token)
            constraint.accept(token)
            out.append(token)
        assert tokenizer.is_eog(out[-1])
        assert isinstance(json.loads(tokenizer.decode(out, skip_special=True)), dict)


@pytest.mark.parametrize("rejection", [True, False], ids=["rejection", "mask"])
def test_greedy_is_the_argmax_over_allowed_tokens(tokenizer, rejection):
    factory = JsonConstraintFactory(tokenizer, rejection=rejection)
    sampler = Sampler(SamplerParams(temperature=0.0))
    rng = np.random.default_rng(3)
    bias = closing_bias(factory)
    constraint = factory.new()
    while not constraint.finished:
        logits = rng.normal(size=factory.n_vocab).astype(np.float32) + bias
        allowed = brute_mask(constraint)
        expected = int(np.flatnonzero(allowed)[np.argmax(logits[allowed])])
        token = constraint.sample(sampler, logits)
        assert token == expected
        constraint.accept(token)


def test_logits_padded_past_the_vocabulary_never_pick_padding(factory):
    constraint = factory.new()
    logits = np.zeros(factory.n_vocab + 64, dtype=np.float32)
    logits[factory.n_vocab :] = 100.0
    token = constraint.sample(Sampler(SamplerParams(temperature=0.0)), logits)
    assert token < factory.n_vocab and constraint.allows(token)
    with pytest.raises(TesseraError, match="full logits row"):
        constraint.sample(Sampler(), logits[:10])


class _NoEog(ByteVocab):
    def is_eog(self, i: int) -> bool:
        return False


def test_a_tokenizer_without_eog_is_refused():
    with pytest.raises(TesseraError, match="end-of-generation"):
        JsonConstraintFactory(_NoEog([b"{", b"}"]))


def expected_distribution(params: SamplerParams, logits: np.ndarray, allowed) -> np.ndarray:
    """The sampler chain on masked logits, computed directly (the oracle)."""
    logits = np.where(allowed, logits.astype(np.float64), -np.inf)
    keep = np.isfinite(logits)
    order = np.argsort(-logits, kind="stable")
    if params.top_k > 0:
        keep[order[params.top_k :]] = False
    probs = np.where(keep, np.exp(logits - logits.max()), 0.0)
    probs /= probs.sum()
    if params.top_p < 1.0:
        ranked = [i for i in order if keep[i]]
        cum = np.cumsum(probs[ranked])
        n = int(np.searchsorted(cum, params.top_p)) + 1
        keep[ranked[n:]] = False
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    weights = np.where(keep, np.exp((logits - logits.max()) / params.temperature), 0.0)
    return weights / weights.sum()


@pytest.mark.parametrize("chain", [c for c in CHAINS if c != "penalty"])
def test_rejection_sampling_draws_from_the_masked_distribution(chain, monkeypatch):
    """10000 draws per path; each token's count must lie within 5.5 binomial standard
    deviations of the masked chain's probability (two-sided normal tail 3.8e-8 per token,
    so with 20 tokens x 6 chains x 2 paths a false failure is below 1e-5 per unseeded run;
    the seeds are fixed, so the test is deterministic)."""
    rng = np.random.default_rng(11)
    logits = rng.normal(scale=1.5, size=SMALL.n_vocab).astype(np.float32)
    n = 10000
    for rejection in (True, False):
        factory = JsonConstraintFactory(
            SMALL, rejection=rejection, mask_cache_size=0, lazy_visits=n
        )
        constraint = factory.new()
        constraint.state.feed(b'{"a":')  # a value comes next: about half the tokens fit
        allowed = brute_mask(constraint)
        assert 5 <= allowed.sum() <= SMALL.n_vocab - 5
        expected = expected_distribution(CHAINS[chain], logits, allowed)
        params = CHAINS[chain]
        if rejection and (0 < params.top_k < SMALL.n_vocab or params.top_p >= 1.0):
            # the lazy path must serve every draw on this small vocabulary (top-p over the
            # whole vocabulary needs the full mask by design)
            monkeypatch.setattr(factory, "allowed_mask", lambda state: pytest.fail("mask used"))
        sampler = Sampler(attrs.evolve(CHAINS[chain], seed=5))
        counts = np.bincount(
            [constraint.sample(sampler, logits) for _ in range(n)], minlength=SMALL.n_vocab
        )
        monkeypatch.undo()
        sigma = np.sqrt(n * expected * (1 - expected))
        assert np.all(np.abs(counts - n * expected) <= 5.5 * sigma + 1), (counts, n * expected)
        assert np.all(counts[expected == 0] == 0)


def test_the_switches_turn_the_optimizations_off(monkeypatch):
    monkeypatch.setenv("TESSERA_JSON_REJECTION", "0")
    monkeypatch.setenv("TESSERA_JSON_VECTOR", "0")
    factory = JsonConstraintFactory(SMALL)
    assert not factory.rejection and factory._builder._strings is None
    monkeypatch.setenv("TESSERA_JSON_REJECTION", "1")
    monkeypatch.setenv("TESSERA_JSON_VECTOR", "1")
    factory = JsonConstraintFactory(SMALL)
    assert factory.rejection and factory._builder._strings is not None


def test_a_state_seen_again_gets_its_mask_cached():
    factory = JsonConstraintFactory(SMALL, lazy_visits=1)
    sampler = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    logits = np.zeros(SMALL.n_vocab, dtype=np.float32)
    constraint = factory.new()
    constraint.state.feed(b'{"a":')
    constraint.sample(sampler, logits)
    assert not factory._masks  # the first visit is served by rejection alone
    constraint.sample(sampler, logits)
    assert list(factory._masks) == [constraint.state.key()]


def close_document(state) -> bytes:
    """Bytes that finish the document, each the first byte the validator accepts from a
    fixed order that closes things (strings, then containers) before opening new ones."""
    order = b'"}]:0{' + bytes(range(256))
    out = bytearray()
    while not state.complete:
        b = next(b for b in order if state.accepts(bytes([b])))
        state.step(b)
        out.append(b)
    return bytes(out)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_default_model_writes_json_prefixes_under_the_constraint(seed):
    """A trained model's logits through the whole stack: after every token the output is
    json.loads-able once closed, and exactly json.loads-able if it completed by itself."""
    from tessera.engine.batch import Batch
    from tessera.engine.context import Context, ContextParams
    from tessera.engine.generate import prefill
    from tessera.files.load import load_model
    from tessera.plugin_manager import Runtime

    model = load_model(default_model_path(), Runtime(), "numpy")
    tok = model.tokenizer
    ctx = Context(model, ContextParams(n_ctx=256))
    prompt = tok.encode("Here is the answer as JSON: ")
    logits = prefill(ctx, prompt)
    factory = JsonConstraintFactory(tok)
    constraint, sampler, out = factory.new(), Sampler(SamplerParams(seed=seed)), []
    while len(out) < 48:
        token = constraint.sample(sampler, logits, out)
        constraint.accept(token)
        if constraint.finished:
            break
        out.append(token)
        text = tok.decode(out, skip_special=True).encode()
        state = factory.new().state
        assert state.feed(text)
        assert isinstance(json.loads(text + close_document(state)), dict)
        logits = ctx.decode(Batch([token], [len(prompt) + len(out) - 1], [0], [True]))[0]
    if constraint.finished:
        assert isinstance(json.loads(tok.decode(out, skip_special=True)), dict)

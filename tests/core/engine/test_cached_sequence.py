"""CachedSequence: a second prompt evaluates only what follows the cached prefix, its tokens
equal a fresh context's, and the record follows the KV cache however a generation ends."""

from __future__ import annotations

import pytest

from tessera.engine.cached_sequence import CachedSequence, common_prefix
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import ContextOverflowError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf

RUNTIME = Runtime()
GREEDY = SamplerParams(temperature=0.0)
PROMPT = [1, 17, 42, 99, 5, 23, 61, 8]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_gguf(tmp_path_factory.mktemp("models") / "m.gguf", "llama")
    return load_model(path, RUNTIME, "numpy")


def _context(model, n_ctx=64):
    return Context(model, ContextParams(n_ctx=n_ctx, n_batch=64, n_ubatch=16))


def _fresh(model, prompt, n):
    """The oracle: the engine's generate on an empty context."""
    return list(generate(_context(model), prompt, n, Sampler(GREEDY)))


def _cached_length(seq):
    return seq.ctx.kv.seq_pos_max(seq.seq_id) + 1


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_second_turn_evaluates_only_the_new_tokens_and_matches_a_fresh_context(model):
    seq = CachedSequence(_context(model))
    first = list(seq.generate(PROMPT, 6, Sampler(GREEDY)))
    assert first == _fresh(model, PROMPT, 6)
    # the last sampled token was never evaluated: the cache holds the rest
    assert seq.tokens == PROMPT + first[:-1] and len(seq.tokens) == _cached_length(seq)
    turn_2 = PROMPT + first + [3, 14, 15]
    stats = GenerationStats()
    second = list(seq.generate(turn_2, 5, Sampler(GREEDY), stats=stats))
    assert second == _fresh(model, turn_2, 5)
    assert stats.n_prompt == len(turn_2) - (len(PROMPT) + len(first) - 1)


def test_a_changed_prefix_is_evaluated_from_where_it_differs(model):
    seq = CachedSequence(_context(model))
    list(seq.generate(PROMPT, 3, Sampler(GREEDY)))
    changed = PROMPT[:3] + [7, 7, 7]
    stats = GenerationStats()
    assert list(seq.generate(changed, 4, Sampler(GREEDY), stats=stats)) == _fresh(model, changed, 4)
    assert stats.n_prompt == len(changed) - 3


def test_the_same_prompt_again_keeps_all_but_its_last_token(model):
    seq = CachedSequence(_context(model))
    list(seq.generate(PROMPT, 1, Sampler(GREEDY)))
    assert seq.reusable(PROMPT) == len(PROMPT) - 1
    stats = GenerationStats()
    assert list(seq.generate(PROMPT, 4, Sampler(GREEDY), stats=stats)) == _fresh(model, PROMPT, 4)
    assert stats.n_prompt == 1


def test_closing_early_records_what_the_cache_holds(model):
    seq = CachedSequence(_context(model))
    tokens = seq.generate(PROMPT, 10, Sampler(GREEDY))
    got = [next(tokens), next(tokens)]
    tokens.close()
    assert seq.tokens == PROMPT + got[:1] and len(seq.tokens) == _cached_length(seq)


def test_an_interrupt_inside_a_decode_leaves_a_true_record(model, monkeypatch):
    ctx = _context(model)
    seq = CachedSequence(ctx)
    decode = ctx.decode
    calls = []

    def interrupted(batch):
        calls.append(len(batch))
        if len(calls) == 4:
            raise KeyboardInterrupt
        return decode(batch)

    monkeypatch.setattr(ctx, "decode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        list(seq.generate(PROMPT, 10, Sampler(GREEDY)))
    monkeypatch.setattr(ctx, "decode", decode)
    assert len(seq.tokens) == _cached_length(seq) == len(PROMPT) + 2
    assert seq.tokens[: len(PROMPT)] == PROMPT
    follow = seq.tokens + [4, 4]
    assert list(seq.generate(follow, 3, Sampler(GREEDY))) == _fresh(model, follow, 3)


def test_a_refused_prompt_leaves_the_cache_and_the_record(model):
    seq = CachedSequence(_context(model, n_ctx=16))
    list(seq.generate(PROMPT, 2, Sampler(GREEDY)))
    before = list(seq.tokens)
    with pytest.raises(ContextOverflowError):
        seq.generate(list(range(1, 20)), 2, Sampler(GREEDY))  # refused at the call
    assert seq.tokens == before and _cached_length(seq) == len(before)


def test_clear_empties_the_sequence(model):
    seq = CachedSequence(_context(model))
    list(seq.generate(PROMPT, 2, Sampler(GREEDY)))
    seq.clear()
    assert seq.tokens == [] and _cached_length(seq) == 0
    stats = GenerationStats()
    list(seq.generate(PROMPT, 1, Sampler(GREEDY), stats=stats))
    assert stats.n_prompt == len(PROMPT)

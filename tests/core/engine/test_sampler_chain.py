"""The sampler chain's newer stages against re-derivations of llama.cpp's formulas.

Each oracle here is written from the formula with plain Python loops over sorted lists,
independently of the numpy code in tessera.engine.sampler_chain and tessera.engine.dry.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera.engine.dry import DryBreakers, dry_penalty
from tessera.engine.sampling import Sampler, SamplerParamError, SamplerParams

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04], dtype=np.float32))
OFF = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


def softmax(values):
    m = max(values)
    w = [math.exp(v - m) for v in values]
    return [x / sum(w) for x in w]


def test_frequency_and_presence_penalties_follow_llama_cpp():
    logits = np.array([2.0, -1.0, 0.5, 3.0, 1.0], dtype=np.float32)
    history = [0, 0, 1, 4, 0, 3]  # token 0 three times; 2 never
    p = SamplerParams(
        repeat_penalty=1.5, repeat_last_n=-1, frequency_penalty=0.25, presence_penalty=0.5
    )
    want = []
    for token, logit in enumerate(logits.tolist()):
        count = history.count(token)
        if count:
            logit = logit * 1.5 if logit <= 0 else logit / 1.5
            logit -= count * 0.25 + 0.5
        want.append(logit)
    np.testing.assert_allclose(Sampler(p).apply_penalty(logits, history), want, rtol=1e-6)


def test_penalties_only_see_the_last_repeat_last_n_tokens():
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    p = SamplerParams(repeat_last_n=2, frequency_penalty=1.0)
    out = Sampler(p).apply_penalty(logits, [0, 0, 0, 1, 1])
    np.testing.assert_allclose(out, [1.0, -1.0, 1.0])


def test_greedy_with_penalties_takes_the_argmax_of_the_penalized_logits():
    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = rng.normal(size=32).astype(np.float32)
        history = rng.integers(0, 32, size=20).tolist()
        p = SamplerParams(
            temperature=0, repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2
        )
        penalized = logits.copy()
        for t in set(history):
            v = penalized[t]
            penalized[t] = (v * 1.3 if v <= 0 else v / 1.3) - (history[-64:].count(t) * 0.4 + 0.2)
        assert Sampler(p).sample(logits, history) == int(np.argmax(penalized))


def dry_oracle(window, mult, base, allowed, breaker_tokens=()):
    """DRY by brute force: for every earlier end j whose stretch equals the history's end,
    the token after j would extend the repeat; the repeat may not cross a breaker."""
    n = len(window)
    limit = n
    for back in range(n):
        if window[n - 1 - back] in breaker_tokens:
            limit = back
            break
    longest = {}
    for j in range(n - 1):
        length = 0
        while length < limit and j - length >= 0 and window[j - length] == window[n - 1 - length]:
            length += 1
        if length >= allowed:
            follower = window[j + 1]
            longest[follower] = max(longest.get(follower, -1), length)
    return {t: mult * base ** (length - allowed) for t, length in longest.items()
            if t not in breaker_tokens}  # fmt: skip


def test_dry_penalizes_the_token_that_extends_a_repeat_exactly():
    # "1 2 3" ends the history and appeared before, followed by 4
    history = [1, 2, 3, 4, 9, 1, 2, 3]
    out = dry_penalty(np.zeros(10, dtype=np.float32), history, 0.8, 1.75, 2, -1)
    want = np.zeros(10, dtype=np.float32)
    want[4] = -0.8 * 1.75 ** (3 - 2)
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_dry_matches_a_brute_force_oracle_on_random_histories():
    rng = np.random.default_rng(1)
    for _ in range(200):
        history = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
        out = dry_penalty(np.zeros(4, dtype=np.float32), history, 1.0, 1.5, 2, -1)
        want = np.zeros(4)
        for token, penalty in dry_oracle(history, 1.0, 1.5, 2).items():
            want[token] -= penalty
        np.testing.assert_allclose(out, want, rtol=1e-6)


def test_a_sequence_breaker_ends_the_repeat_and_is_never_penalized():
    breakers = DryBreakers({7: ((),)})
    # the breaker 7 two tokens back caps the repeat "1 2 3" at "2 3"
    history = [1, 2, 3, 4, 9, 1, 7, 2, 3]
    out = dry_penalty(np.zeros(10, dtype=np.float32), history, 0.8, 1.75, 2, -1, breakers)
    want = np.zeros(10)
    for token, penalty in dry_oracle(history, 0.8, 1.75, 2, {7}).items():
        want[token] -= penalty
    assert want[4] == pytest.approx(-0.8)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    # "1 2" repeats and 7 followed it: 7 is a breaker, so it keeps its logit
    out = dry_penalty(np.zeros(10, dtype=np.float32), [1, 2, 7, 1, 2], 1.0, 2.0, 2, -1, breakers)
    assert not out.any()
    out = dry_penalty(np.zeros(10, dtype=np.float32), [1, 2, 7, 1, 2], 1.0, 2.0, 2, -1)
    assert out[7] == pytest.approx(-1.0)


def test_dry_breakers_from_strings_find_whole_and_split_breakers():
    pieces = ["xa", "b", "ab", "c", "\n"]
    breakers = DryBreakers.from_strings(["ab", "\n"], pieces, lambda s: [pieces.index(s)])
    # "xa" ends with the start of "ab": "b" must follow; "ab" and "\n" hold a whole one
    assert breakers.heads == {0: ((1,),), 2: ((),), 4: ((),)}
    # "xa" "b" "c" repeats with "c" after it; the split breaker "xa" + "b" stops the
    # repeat at one token, under the allowed length
    history = [3, 0, 1, 3, 4, 0, 1, 3]
    out = dry_penalty(np.zeros(5, dtype=np.float32), history, 1.0, 2.0, 2, -1, breakers)
    assert not out.any()
    out = dry_penalty(np.zeros(5, dtype=np.float32), history, 1.0, 2.0, 2, -1)
    np.testing.assert_allclose(out, [0, 0, 0, 0, -2.0])


def test_dry_penalty_last_n_limits_the_scan():
    history = [1, 2, 3, 4, 9, 9, 9, 1, 2, 3]
    assert not dry_penalty(np.zeros(10, dtype=np.float32), history, 1.0, 2.0, 2, 5).any()
    assert dry_penalty(np.zeros(10, dtype=np.float32), history, 1.0, 2.0, 2, 10)[4] < 0


def typical_oracle(logits, p):
    probs = softmax(list(logits))
    entropy = -sum(q * math.log(q) for q in probs)
    order = sorted(range(len(probs)), key=lambda i: abs(-math.log(probs[i]) - entropy))
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += probs[i]
        if mass > p:
            break
    total = sum(probs[i] for i in kept)
    return [probs[i] / total if i in kept else 0.0 for i in range(len(probs))]


@pytest.mark.parametrize("typical_p", [0.2, 0.5, 0.9])
def test_typical_p_keeps_the_locally_typical_set(typical_p):
    logits = np.array([3.0, 2.5, 2.4, 1.0, 0.1, -1.0], dtype=np.float32)
    got = Sampler(SamplerParams(typical_p=typical_p, **OFF)).probs(logits)
    np.testing.assert_allclose(got, typical_oracle(logits, typical_p), atol=1e-9)


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_best():
    logits = np.array([4.0, 3.5, 1.0, 0.0, -2.0, -np.inf], dtype=np.float32)
    finite = [4.0, 3.5, 1.0, 0.0, -2.0]
    mean = sum(finite) / len(finite)
    std = math.sqrt(sum((x - mean) ** 2 for x in finite) / len(finite))
    keep = [x >= 4.0 - 1.0 * std for x in finite]
    kept = softmax([x for x, k in zip(finite, keep, strict=True) if k])
    want = [*kept, *[0.0] * (6 - len(kept))]
    assert sum(keep) == 2
    got = Sampler(SamplerParams(top_n_sigma=1.0, **OFF)).probs(logits)
    np.testing.assert_allclose(got, want, atol=1e-9)


def test_xtc_always_on_removes_all_top_choices_but_the_least_likely():
    # 0.5, 0.25 and 0.15 clear the 0.1 threshold: only 0.15 of them stays
    got = Sampler(SamplerParams(xtc_probability=1.0, xtc_threshold=0.1, **OFF)).probs(LOGITS)
    np.testing.assert_allclose(got, [0, 0, 0.6, 0.24, 0.16], atol=1e-6)


def test_xtc_with_probability_one_half_mixes_both_distributions():
    params = SamplerParams(xtc_probability=0.5, xtc_threshold=0.1, seed=7, **OFF)
    sampler = Sampler(params)
    n = 20000
    counts = np.bincount([sampler.sample(LOGITS) for _ in range(n)], minlength=5) / n
    want = 0.5 * np.exp(LOGITS) + 0.5 * np.array([0, 0, 0.6, 0.24, 0.16])
    np.testing.assert_allclose(counts, want, atol=0.015)


def test_xtc_above_one_half_threshold_is_off():
    on = Sampler(SamplerParams(xtc_probability=1.0, xtc_threshold=0.6, **OFF)).probs(LOGITS)
    np.testing.assert_allclose(on, np.exp(LOGITS), atol=1e-6)


def chain_oracle(logits, p):
    """llama.cpp's default order on a sorted list: top-k, typical, top-p, min-p, temp."""
    cands = sorted(enumerate(logits.tolist()), key=lambda c: -c[1])
    if 0 < p.top_k < len(cands):
        cands = cands[: p.top_k]
    if p.typical_p < 1:
        probs = typical_oracle([v for _, v in cands], p.typical_p)
        cands = [c for c, q in zip(cands, probs, strict=True) if q > 0]
    if p.top_p < 1:
        probs, mass, n = softmax([v for _, v in cands]), 0.0, 0
        for q in probs:
            mass, n = mass + q, n + 1
            if mass >= p.top_p:
                break
        cands = cands[:n]
    if p.min_p > 0:
        probs = softmax([v for _, v in cands])
        cands = [c for c, q in zip(cands, probs, strict=True) if q >= p.min_p * probs[0]]
    probs = softmax([v / p.temperature for _, v in cands])
    out = [0.0] * len(logits)
    for (i, _), q in zip(cands, probs, strict=True):
        out[i] = q
    return out


def test_the_whole_chain_matches_llama_cpp_order_on_random_logits():
    rng = np.random.default_rng(3)
    for _ in range(100):
        logits = rng.normal(scale=2.0, size=24).astype(np.float32)
        p = SamplerParams(
            temperature=float(rng.uniform(0.3, 1.5)),
            top_k=int(rng.integers(0, 20)),
            typical_p=float(rng.choice([1.0, rng.uniform(0.3, 0.95)])),
            top_p=float(rng.uniform(0.5, 1.0)),
            min_p=float(rng.uniform(0.0, 0.2)),
        )
        np.testing.assert_allclose(Sampler(p).probs(logits), chain_oracle(logits, p), atol=1e-7)


@pytest.mark.parametrize(
    "field, value",
    [
        ("xtc_probability", 1.5),
        ("xtc_threshold", -0.1),
        ("dry_base", 0.5),
        ("dry_multiplier", -1.0),
        ("dry_allowed_length", -1),
        ("dry_penalty_last_n", -2),
        ("presence_penalty", float("nan")),
        ("typical_p", float("inf")),
        ("dry_sequence_breakers", "\n"),
    ],
)
def test_out_of_range_settings_name_the_field(field, value):
    with pytest.raises(SamplerParamError, match=field) as info:
        SamplerParams(**{field: value})
    assert info.value.field == field

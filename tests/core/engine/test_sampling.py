"""Sampling: each stage against a direct computation of what it should keep."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.engine.sampling import Sampler, SamplerParamError, SamplerParams
from tessera.errors import TesseraError

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04], dtype=np.float32))


def frequencies(params: SamplerParams, logits=LOGITS, n=20000) -> np.ndarray:
    sampler = Sampler(params)
    counts = np.bincount([sampler.sample(logits) for _ in range(n)], minlength=len(logits))
    return counts / n


def test_greedy_takes_the_argmax():
    logits = np.array([0.1, 3.0, -1.0, 2.9], dtype=np.float32)
    assert Sampler(SamplerParams(temperature=0)).sample(logits) == 1


def test_plain_sampling_follows_the_softmax():
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    np.testing.assert_allclose(frequencies(params), np.exp(LOGITS), atol=0.015)


def test_temperature_sharpens_the_distribution():
    params = SamplerParams(temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, seed=2)
    p = np.exp(LOGITS / 0.5)
    np.testing.assert_allclose(frequencies(params), p / p.sum(), atol=0.015)


def test_top_k_keeps_the_k_most_likely_renormalized():
    params = SamplerParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=3)
    np.testing.assert_allclose(frequencies(params), [2 / 3, 1 / 3, 0, 0, 0], atol=0.015)


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # 0.5 + 0.25 = 0.75 < 0.8, so the third token (cumulative 0.9) is kept too
    params = SamplerParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=4)
    np.testing.assert_allclose(
        frequencies(params), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0], atol=0.015
    )


def test_min_p_drops_tokens_below_a_fraction_of_the_best():
    params = SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25, seed=5)
    np.testing.assert_allclose(
        frequencies(params), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0], atol=0.015
    )


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    sampler = Sampler(SamplerParams(repeat_penalty=2.0, repeat_last_n=2))
    out = sampler.apply_penalty(np.array([4.0, -1.0, 3.0, 1.0], dtype=np.float32), [2, 0, 1])
    np.testing.assert_allclose(out, [2.0, -2.0, 3.0, 1.0])  # token 2 is outside the last 2


def test_repeat_last_n_minus_one_penalizes_the_whole_history():
    sampler = Sampler(SamplerParams(repeat_penalty=2.0, repeat_last_n=-1))
    out = sampler.apply_penalty(np.array([4.0, -1.0, 3.0, 1.0], dtype=np.float32), [2, 0, 1])
    np.testing.assert_allclose(out, [2.0, -2.0, 1.5, 1.0])


def test_a_negative_top_k_is_off_as_in_llama_cpp():
    off = dict(temperature=1.0, top_p=1.0, min_p=0.0)
    np.testing.assert_array_equal(
        Sampler(SamplerParams(top_k=-1, **off)).probs(LOGITS),
        Sampler(SamplerParams(top_k=0, **off)).probs(LOGITS),
    )


def test_same_seed_same_tokens_other_seed_other_tokens():
    def draws(seed):
        sampler = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed))
        return [sampler.sample(LOGITS) for _ in range(50)]

    assert draws(42) == draws(42)
    assert draws(42) != draws(43)


@pytest.mark.parametrize(
    "field,value", [("top_p", 1.5), ("min_p", -0.1), ("repeat_last_n", -2), ("top_k", 1.5)]
)
def test_invalid_settings_are_rejected_with_the_field_name(field, value):
    with pytest.raises(TesseraError, match=field):
        SamplerParams(**{field: value})


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repeat_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_are_refused_naming_field_value_and_range(field, value):
    with pytest.raises(SamplerParamError, match="finite number") as err:
        SamplerParams(**{field: value})
    assert err.value.field == field
    assert str(err.value).startswith(f"{field} must be")
    assert f"got {value!r}" in str(err.value)


@pytest.mark.parametrize("value", [0, 0.0, -1.0])
def test_repeat_penalty_must_be_above_0(value):
    with pytest.raises(SamplerParamError, match=r"repeat_penalty must be a finite number > 0"):
        SamplerParams(repeat_penalty=value)


@pytest.mark.parametrize("penalty", [1e-30, 5e-324, 1e30, 1.7e308])
def test_extreme_penalties_keep_the_distribution_finite(penalty):
    sampler = Sampler(
        SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=penalty)
    )
    probs = sampler.probs(LOGITS, history=[0, 1, 2, 3, 4])
    assert np.isfinite(probs).all() and probs.sum() == pytest.approx(1.0)
    assert 0 <= sampler.sample(LOGITS, history=[0, 1]) < len(LOGITS)


def test_seed_minus_one_is_a_random_seed():
    assert SamplerParams(seed=-1).seed is None
    assert SamplerParams(seed=None) == SamplerParams(seed=-1)

    def draws():
        sampler = Sampler(SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=-1))
        return [sampler.sample(LOGITS) for _ in range(50)]

    # two random 50-draw sequences over 5 tokens agreeing is next to impossible
    assert draws() != draws()


@pytest.mark.parametrize("seed", [-2, -(2**63), 2**64, 1.5, "7", True])
def test_other_seeds_than_minus_one_below_0_or_past_2_64_are_refused(seed):
    with pytest.raises(
        SamplerParamError, match="seed must be an integer between 0 and 2\\*\\*64 - 1"
    ):
        SamplerParams(seed=seed)


def test_the_largest_seed_works():
    sampler = Sampler(SamplerParams(temperature=1.0, seed=2**64 - 1))
    assert 0 <= sampler.sample(LOGITS) < len(LOGITS)


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": -1.0},  # greedy, as llama.cpp
        {"temperature": 0},
        {"temperature": 5.0},
        {"top_k": 0},
        {"top_p": 0.0},
        {"top_p": 1},
        {"min_p": 1.0},
        {"repeat_penalty": 1e-3},
        {"repeat_last_n": 0},
        {"seed": 0},
        {"seed": np.int64(3)},
    ],
)
def test_every_value_valid_before_still_samples(kw):
    sampler = Sampler(SamplerParams(**kw))
    assert 0 <= sampler.sample(LOGITS, history=[1, 2]) < len(LOGITS)


@pytest.mark.parametrize(("field", "value"), [("top_k", 2.0), ("repeat_last_n", 1.5)])
def test_integer_fields_refuse_floats(field, value):
    with pytest.raises(SamplerParamError, match=f"{field} must be an integer"):
        SamplerParams(**{field: value})

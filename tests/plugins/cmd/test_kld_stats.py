"""KL-divergence statistics: each sum against a row-by-row transcription of llama.cpp's
float32 steps and against float64 math; percentiles and uncertainties against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.plugins.cmd.kld_base import quantize_log_probs
from tessera.plugins.cmd.kld_stats import (
    KLDivergence,
    covariance,
    mean_and_uncertainty,
    median,
    percentile,
)

F32 = np.float32


def llama_row(z: np.ndarray, stored: np.ndarray, tok: int) -> dict:
    """One position as perplexity.cpp's KLD ``log_softmax`` computes it, step by step in
    float32 (sums in float64)."""
    n_vocab = len(z)
    max_logit = F32(z.max())
    log_sum_exp = F32(np.log(np.exp(z - max_logit).astype(np.float64).sum()))
    scale, min_lp = stored[:4].copy().view(np.float32)
    q = stored[4 : 4 + n_vocab].astype(np.float32)
    nll = F32(F32(max_logit + log_sum_exp) - z[tok])
    nll_base = F32(-(F32(scale * q[tok]) + min_lp))
    norm = F32(max_logit + log_sum_exp)
    p_log_base = (scale * q + min_lp).astype(np.float32)
    kld = 0.0
    for i in np.flatnonzero(p_log_base > F32(-16)):
        kld += float(F32(np.exp(p_log_base[i]) * F32(F32(p_log_base[i] - z[i]) + norm)))
    p_diff = F32(np.exp(-nll) - np.exp(-nll_base))
    return {
        "nll": float(nll),
        "nll_base": float(nll_base),
        "kld": kld,
        "p_diff": float(p_diff),
        "same_top": int(np.argmax(z)) == int(np.argmax(p_log_base)),
    }


def exact_row(z: np.ndarray, base_logits: np.ndarray, tok: int) -> dict:
    """The same position in float64 from the unquantized base logits."""
    lq = z.astype(np.float64) - np.logaddexp.reduce(z.astype(np.float64))
    lb = base_logits.astype(np.float64) - np.logaddexp.reduce(base_logits.astype(np.float64))
    keep = lb > -16
    return {"kld": float(np.sum(np.exp(lb[keep]) * (lb[keep] - lq[keep]))), "nll": -lq[tok]}


@pytest.fixture
def chunk():
    rng = np.random.default_rng(7)
    base = rng.normal(0, 2.5, (40, 300)).astype(np.float32)
    model = (base + rng.normal(0, 0.4, base.shape)).astype(np.float32)
    tokens = rng.integers(0, 300, 40)
    return model, base, tokens


def test_sums_follow_llama_cpp_row_by_row(chunk):
    model, base, tokens = chunk
    stored = quantize_log_probs(base)
    kld = KLDivergence()
    kld.add_chunk(model[:25], stored[:25], tokens[:25])
    kld.add_chunk(model[25:], stored[25:], tokens[25:])
    rows = [llama_row(model[r], stored[r], tokens[r]) for r in range(40)]
    nll = np.array([r["nll"] for r in rows])
    nll_base = np.array([r["nll_base"] for r in rows])
    kl = np.array([r["kld"] for r in rows])
    p_diff = np.array([r["p_diff"] for r in rows])
    assert kld.count == 40
    assert kld.sum_nll == pytest.approx(nll.sum(), rel=1e-6)
    assert kld.sum_nll2 == pytest.approx((nll * nll).sum(), rel=1e-6)
    assert kld.sum_nll_base == pytest.approx(nll_base.sum(), rel=1e-6)
    assert kld.sum_nll_nll_base == pytest.approx((nll * nll_base).sum(), rel=1e-6)
    assert kld.sum_kld == pytest.approx(kl.sum(), rel=1e-6)
    assert kld.sum_kld2 == pytest.approx((kl * kl).sum(), rel=1e-6)
    assert kld.sum_p_diff == pytest.approx(p_diff.sum(), rel=1e-6, abs=1e-9)
    assert kld.sum_p_diff2 == pytest.approx((p_diff**2).sum(), rel=1e-6)
    assert kld.sum_p_diff4 == pytest.approx((p_diff**4).sum(), rel=1e-6)
    assert kld.max_p_diff == pytest.approx(np.abs(p_diff).max(), rel=1e-6)
    assert kld.n_same_top == sum(r["same_top"] for r in rows)
    assert np.allclose(kld.sorted_kld(), np.sort(kl), rtol=1e-6, atol=0)


def test_kld_is_close_to_the_float64_divergence(chunk):
    model, base, tokens = chunk
    kld = KLDivergence()
    kld.add_chunk(model, quantize_log_probs(base), tokens)
    exact = [exact_row(model[r], base[r], tokens[r]) for r in range(40)]
    # the stored base is rounded to steps of (range / 65535) <= 2.4e-4 nats
    per_token = kld.sorted_kld() - np.sort([e["kld"] for e in exact])
    assert np.abs(per_token).max() < 2.4e-4
    assert kld.sum_nll / 40 == pytest.approx(np.mean([e["nll"] for e in exact]), rel=1e-6)


def test_a_model_against_its_own_base_diverges_only_by_the_stored_steps(chunk):
    _, base, tokens = chunk
    kld = KLDivergence()
    kld.add_chunk(base, quantize_log_probs(base), tokens)
    assert abs(kld.kld()[0]) < 1e-5 and kld.n_same_top == 40


def test_mean_and_uncertainty_is_the_standard_error():
    x = np.random.default_rng(3).normal(2, 0.5, 50)
    mean, err = mean_and_uncertainty(x.sum(), (x * x).sum(), len(x))
    assert mean == pytest.approx(x.mean(), rel=1e-12)
    assert err == pytest.approx(x.std() / np.sqrt(len(x) - 1), rel=1e-9)
    assert mean_and_uncertainty(x[:10].sum(), (x[:10] ** 2).sum(), 10)[1] == 0.0  # too few
    assert mean_and_uncertainty(0.0, 0.0, 0) == (0.0, 0.0)


def test_covariance_of_the_means():
    rng = np.random.default_rng(4)
    a = rng.normal(0, 1, 200)
    b = a + rng.normal(0, 0.3, 200)
    expected = np.cov(a, b, bias=True)[0, 1] / (len(a) - 1)
    assert covariance(a.sum(), b.sum(), (a * b).sum(), len(a)) == pytest.approx(expected)
    assert covariance(1.0, 1.0, 1.0, 9) == 0.0


@pytest.mark.parametrize("n", [1, 2, 105, 1000])
def test_percentiles_and_median_match_numpy(n):
    values = np.sort(np.random.default_rng(n).normal(0, 1, n).astype(np.float32))
    for fraction in (0.001, 0.01, 0.05, 0.1, 0.25, 0.75, 0.9, 0.95, 0.99, 0.999):
        expected = np.percentile(values.astype(np.float64), 100 * fraction)
        # llama.cpp finds the position in float32: off by its rounding, times the gap there
        pos = fraction * (n - 1)
        off = abs(float(F32(fraction)) - fraction) * (n - 1) + float(np.spacing(F32(pos)))
        gap = float(values[min(int(pos) + 1, n - 1)] - values[int(pos)])
        assert percentile(values, fraction) == pytest.approx(expected, abs=off * gap + 1e-6)
    assert median(values) == pytest.approx(np.median(values.astype(np.float64)), abs=1e-6)
    assert percentile(values, 0.0) == values[0] and percentile(values, 1.0) == values[-1]

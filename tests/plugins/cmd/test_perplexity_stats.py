"""Perplexity from logits: the nll of each next token against a float64 log-softmax, the
estimate and its standard error against numpy, and llama-perplexity's printed lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tessera.plugins.cmd.perplexity_stats import (
    PerplexityEstimate,
    final_line,
    next_token_nll,
    running_line,
)


def test_next_token_nll_is_minus_the_log_softmax():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, (30, 500)).astype(np.float32)
    logits[3] += 80.0  # a row far from zero: the max is subtracted first
    tokens = rng.integers(0, 500, 30)
    x = logits.astype(np.float64)
    expected = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1) - x[range(30), tokens]
    assert np.allclose(next_token_nll(logits, tokens), expected, rtol=1e-6, atol=0)


def test_estimate_and_standard_error():
    nll = np.random.default_rng(1).gamma(2.0, 1.5, 300)
    est = PerplexityEstimate()
    for part in np.split(nll, [17, 150]):
        est.add(part)
    assert est.count == 300
    assert est.ppl == pytest.approx(math.exp(nll.mean()), rel=1e-12)
    # llama.cpp: sqrt((E[x^2] - E[x]^2) / (n - 1)) * PPL, the standard error through exp
    assert est.uncertainty == pytest.approx(nll.std() / math.sqrt(299) * est.ppl, rel=1e-9)


def test_no_spread_gives_no_uncertainty():
    est = PerplexityEstimate()
    est.add(np.full(10, 2.0))
    assert est.uncertainty is None
    assert final_line(est).startswith(f"Final estimate: PPL = {math.exp(2.0):.4f} (no uncertainty")


def test_lines_as_llama_perplexity_prints_them():
    est = PerplexityEstimate()
    est.add(np.array([1.0, 2.0, 4.0]))
    assert running_line(3, est) == f"[3]{math.exp(7 / 3):.4f},"
    err = np.std([1.0, 2.0, 4.0]) / math.sqrt(2) * math.exp(7 / 3)
    assert final_line(est) == f"Final estimate: PPL = {math.exp(7 / 3):.4f} +/- {err:.5f}"

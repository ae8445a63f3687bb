"""Perplexity from next-token logits, as llama-perplexity computes and reports it.

Each scored position adds its negative log-likelihood ``nll = logsumexp(z) - z[next]``;
the estimate is ``PPL = exp(mean nll)`` and its uncertainty the standard error of the mean
nll carried through the exponential, ``PPL * sqrt(var(nll) / (count - 1))``.
"""

from __future__ import annotations

import math

import attrs
import numpy as np


def log_sum_exp(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of float32 ``logits``: its maximum and ``log(sum(exp(z - max)))``.

    As llama.cpp: the exponentials in float32, their sum in float64.
    """
    max_logit = logits.max(axis=1)
    sum_exp = np.exp(logits - max_logit[:, None]).sum(axis=1, dtype=np.float64)
    return max_logit, np.log(sum_exp)


def next_token_nll(logits: np.ndarray, next_tokens: np.ndarray) -> np.ndarray:
    """float64 ``-log p(next_tokens[i])`` under row ``i`` of float32 ``logits`` ``(R, V)``."""
    logits = np.asarray(logits, dtype=np.float32)
    max_logit, lse = log_sum_exp(logits)
    picked = logits[np.arange(len(logits)), next_tokens]
    # llama.cpp: (z[tok] - max) in float32, then the float64 log of the sum
    return -((picked - max_logit).astype(np.float64) - lse)


@attrs.define
class PerplexityEstimate:
    """Running sums of the scored tokens' nll and nll squared."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, nll: np.ndarray) -> None:
        self.nll += float(np.sum(nll))
        self.nll2 += float(np.sum(nll * nll))
        self.count += len(nll)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.count)

    @property
    def uncertainty(self) -> float | None:
        """The standard error of the estimate; None when the variance is not positive
        (llama.cpp then prints "Unexpected negative standard deviation")."""
        mean = self.nll / self.count
        var = self.nll2 / self.count - mean * mean
        if var <= 0 or self.count < 2:
            return None
        return math.sqrt(var / (self.count - 1)) * self.ppl


def running_line(index: int, estimate: PerplexityEstimate) -> str:
    """llama-perplexity's per-chunk output, ``[index]ppl,`` (one-based chunk number)."""
    return f"[{index}]{estimate.ppl:.4f},"


def final_line(estimate: PerplexityEstimate) -> str:
    err = estimate.uncertainty
    if err is None:
        return (
            f"Final estimate: PPL = {estimate.ppl:.4f} (no uncertainty: the scored tokens' "
            "log-likelihoods have no spread)"
        )
    return f"Final estimate: PPL = {estimate.ppl:.4f} +/- {err:.5f}"

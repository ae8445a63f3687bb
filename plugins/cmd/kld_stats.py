"""KL divergence of a model's next-token distributions from a stored base, as llama-perplexity.

Per scored position, with ``b`` the base's stored log-probabilities and ``z`` the model's
logits: ``KLD = sum_i exp(b_i) * (b_i - log_softmax(z)_i)`` over the entries with
``b_i > -16``; ``p_diff = p(next) - p_base(next)``; "same top" when both argmaxes agree.
The steps are llama.cpp's, float32 where it uses float32, so the numbers compare.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from tessera.plugins.cmd.kld_base import dequantize_log_probs

#: Stored log-probabilities at or below this are left out of the sum (llama.cpp's cut).
MIN_LOG_PROB = np.float32(-16.0)


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """Mean of values with sum ``total`` and sum of squares ``total2``, and its standard
    error (0 for ten values or fewer, or no spread)."""
    if count < 1:
        return 0.0, 0.0
    mean = total / count
    var = total2 / count - mean * mean
    return mean, math.sqrt(var / (count - 1)) if var > 0 and count > 10 else 0.0


def covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    """Covariance of the two means (0 below ten values), as llama.cpp estimates it."""
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


@attrs.define
class KLDivergence:
    """Sums over every scored position so far, and each position's KLD and p_diff."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = attrs.Factory(list)
    p_diff_values: list[np.ndarray] = attrs.Factory(list)

    def add_chunk(self, logits: np.ndarray, base_rows: np.ndarray, next_tokens: np.ndarray) -> None:
        """Score float32 ``logits`` ``(R, V)`` against ``R`` stored base rows."""
        logits = np.asarray(logits, dtype=np.float32)
        rows, n_vocab = logits.shape
        at = np.arange(rows)
        max_logit = logits.max(axis=1)
        sum_exp = np.exp(logits - max_logit[:, None]).sum(axis=1, dtype=np.float64)
        log_norm = max_logit + np.log(sum_exp).astype(np.float32)  # max + log-sum-exp, float32
        nll = log_norm - logits[at, next_tokens]
        base = dequantize_log_probs(base_rows, n_vocab)
        nll_base = -base[at, next_tokens]
        terms = np.exp(base) * (base - logits + log_norm[:, None])
        kld = np.where(base > MIN_LOG_PROB, terms, np.float32(0)).sum(axis=1, dtype=np.float64)
        p_diff = np.exp(-nll) - np.exp(-nll_base)
        nll64, nll_base64 = nll.astype(np.float64), nll_base.astype(np.float64)
        self.sum_nll += float(nll64.sum())
        self.sum_nll2 += float((nll * nll).sum(dtype=np.float64))
        self.sum_nll_base += float(nll_base64.sum())
        self.sum_nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.sum_nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        p_diff2 = (p_diff * p_diff).astype(np.float64)
        self.sum_p_diff += float(p_diff.sum(dtype=np.float64))
        self.sum_p_diff2 += float(p_diff2.sum())
        self.sum_p_diff4 += float((p_diff2 * p_diff2).sum())
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max()))
        self.n_same_top += int((logits.argmax(axis=1) == base.argmax(axis=1)).sum())
        self.count += rows
        self.kld_values.append(kld.astype(np.float32))
        self.p_diff_values.append(p_diff.astype(np.float32))

    def log_ppl(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count)

    def log_ppl_base(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count)

    def log_ppl_cov(self) -> float:
        return covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count)

    def log_ppl_ratio(self) -> tuple[float, float]:
        """``ln(PPL(Q)/PPL(base))`` and its uncertainty (the two are correlated)."""
        (a, da), (b, db) = self.log_ppl(), self.log_ppl_base()
        return a - b, math.sqrt(max(da * da + db * db - 2.0 * self.log_ppl_cov(), 0.0))

    def kld(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)

    def p_diff(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count)

    def p_diff_rms(self) -> tuple[float, float]:
        mse, dmse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count)
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * dmse if rms > 0 else 0.0)

    def same_top(self) -> tuple[float, float]:
        p = self.n_same_top / self.count
        return p, math.sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else 0.0

    def sorted_kld(self) -> np.ndarray:
        return np.sort(np.concatenate(self.kld_values))

    def sorted_p_diff(self) -> np.ndarray:
        return np.sort(np.concatenate(self.p_diff_values))


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's interpolated percentile of sorted float32 values (its float32 steps)."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = np.float32(fraction) * np.float32(len(sorted_values) - 1)
    ip = int(p)
    p = p - np.float32(ip)
    upper = sorted_values[min(ip + 1, len(sorted_values) - 1)]
    return float((np.float32(1) - p) * sorted_values[ip] + p * upper)


def median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2:
        return float(sorted_values[n // 2])
    return float(np.float32(0.5) * (sorted_values[n // 2] + sorted_values[n // 2 - 1]))

"""The stages of the sampler chain, each a function of the candidates it receives.

llama.cpp's default order (common/sampling): penalties -> DRY -> top-n-sigma -> top-k ->
typical-p -> top-p -> min-p -> XTC -> temperature -> draw. Penalties and DRY read the
history and change logits; the others keep a subset of the candidates. Candidates are
``(ids, logits)`` arrays, sorted best first from top-k on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_F32_MAX = float(np.finfo(np.float32).max)


def penalties(
    logits: np.ndarray,
    history: Sequence[int],
    last_n: int,
    repeat: float,
    frequency: float,
    presence: float,
) -> np.ndarray:
    """llama.cpp's penalties over the last ``last_n`` tokens (-1: all): a seen token's
    logit is divided by ``repeat`` (multiplied when <= 0), then loses ``count *
    frequency + presence``. Returns a copy, or ``logits`` itself when nothing applies."""
    if last_n == 0 or not len(history) or (repeat == 1.0 and frequency == 0 and presence == 0):
        return logits
    window = history if last_n < 0 else history[-last_n:]
    seen, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    keep = seen < len(logits)
    seen, counts = seen[keep], counts[keep]
    out = logits.copy()
    old = out[seen]
    # a penalty near 0 or a huge one overflows: clipped, as an infinite logit makes NaN odds
    with np.errstate(over="ignore", divide="ignore"):
        new = np.where(old <= 0, old * repeat, old / repeat)
        new = new - (counts * frequency + presence)
    out[seen] = np.clip(new, -_F32_MAX, _F32_MAX)
    return out


def top_n_sigma(logits: np.ndarray, n: float) -> np.ndarray:
    """Keep the logits within ``n`` standard deviations of the best (the rest -inf);
    -inf logits take no part in the mean and deviation. ``n`` <= 0: off."""
    if n <= 0.0 or len(logits) <= 1:
        return logits
    finite = logits[np.isfinite(logits)]
    if not finite.size:
        return logits
    best, std = float(finite.max()), float(finite.astype(np.float64).std())
    return np.where(logits < best - n * std, -np.inf, logits).astype(logits.dtype)


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (all when ``k`` <= 0), sorted best first, -inf dropped (one kept)."""
    ids = np.arange(len(logits))
    if 0 < k < len(logits):
        ids = np.argpartition(-logits, k - 1)[:k]
    order = np.argsort(-logits[ids], kind="stable")
    ids = ids[order]
    values = logits[ids].astype(np.float64)
    alive = values > -np.inf
    if alive.any():
        ids, values = ids[alive], values[alive]
    else:
        ids, values = ids[:1], np.zeros(1)
    return ids, values


def typical(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling: keep the tokens whose surprise ``-log p`` is closest to
    the entropy until their mass exceeds ``p``; ``p`` >= 1: off. Back in logit order."""
    if p >= 1.0:
        return ids, logits
    probs = softmax(logits)
    with np.errstate(divide="ignore", invalid="ignore"):
        surprise = -np.log(probs)
        entropy = float(np.nansum(probs * surprise))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    over = np.flatnonzero(np.cumsum(probs[order]) > p)
    n = int(over[0]) + 1 if over.size else len(order)
    kept = np.sort(order[:n])  # positions in the sorted candidates: best first again
    return ids[kept], logits[kept]


def top_p(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest best-first prefix whose mass reaches ``p`` (at least one); 1: off."""
    if p >= 1.0:
        return ids, logits
    n = min(len(ids), int(np.searchsorted(np.cumsum(softmax(logits)), p)) + 1)
    return ids[:n], logits[:n]


def min_p(ids: np.ndarray, logits: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens at least ``p`` times as likely as the best (at least one); 0: off."""
    if p <= 0.0:
        return ids, logits
    probs = softmax(logits)
    n = max(1, int(np.count_nonzero(probs >= p * probs[0])))
    return ids[:n], logits[:n]


def xtc(
    ids: np.ndarray,
    logits: np.ndarray,
    probability: float,
    threshold: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Exclude Top Choices: with chance ``probability``, drop every token at or above
    ``threshold`` but the least likely of them (nothing when only one is). Off when
    ``probability`` <= 0 or ``threshold`` > 0.5 (then no random number is drawn)."""
    if probability <= 0.0 or threshold > 0.5 or len(ids) < 2:
        return ids, logits
    if rng.random() > probability:
        return ids, logits
    above = np.flatnonzero(softmax(logits) >= threshold)
    # the candidates are sorted, so the tokens above the threshold come first
    last = int(above[-1]) if above.size and above[0] == 0 else 0
    if last > 0:
        return ids[last:], logits[last:]
    return ids, logits


def tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """The probabilities of the candidates at ``temperature`` (> 0)."""
    return softmax(logits / temperature)

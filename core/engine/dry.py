"""DRY ("Don't Repeat Yourself"): a penalty on tokens that would extend a repeated sequence.

A token that would make the end of the history repeat an earlier stretch of ``n`` tokens
(``n`` >= ``dry_allowed_length``) loses ``dry_multiplier * dry_base ** (n -
dry_allowed_length)`` from its logit, as llama.cpp's DRY sampler. Sequence breakers
(strings such as a newline) end the stretch a repetition may span: the scan back from the
end stops at the last breaker, so a repeat never crosses one, and a token that is a
breaker on its own is never penalized.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

#: llama.cpp's defaults: newline, colon, double quote, asterisk.
DEFAULT_BREAKERS = ("\n", ":", '"', "*")
#: llama.cpp truncates a breaker to 40 characters and a breaker's tail to 20 tokens.
MAX_BREAKER_CHARS = 40
MAX_TAIL_TOKENS = 20
#: ``log(float32 max)``: the exponent is clamped so ``base ** exponent`` stays finite.
_F32_MAX_LOG = 88.7228391


@attrs.frozen
class DryBreakers:
    """Sequence breakers in token form: a head token maps to the token tails that must
    follow it to complete a breaker (an empty tail: the token holds a whole breaker)."""

    heads: Mapping[int, tuple[tuple[int, ...], ...]] = attrs.field(factory=dict)

    @classmethod
    def from_strings(
        cls,
        breakers: Sequence[str],
        pieces: Sequence[str],
        tokenize: Callable[[str], list[int]],
    ) -> DryBreakers:
        """The token form of ``breakers`` for a vocabulary whose token ``i`` reads
        ``pieces[i]``; ``tokenize`` encodes a breaker's rest (no special tokens).

        A token is a head when it contains a breaker, or ends with the breaker's start
        (its tail is then the rest of the breaker, tokenized).
        """
        heads: dict[int, list[tuple[int, ...]]] = {}

        def add(token: int, tail: tuple[int, ...]) -> None:
            tails = heads.setdefault(token, [])
            if tail not in tails:
                tails.append(tail)

        for breaker in breakers:
            breaker = breaker[:MAX_BREAKER_CHARS]
            if not breaker:
                continue
            for token, word in enumerate(pieces):
                if breaker in word:
                    add(token, ())
                    continue
                # the word ends with breaker[:k] for some k: the rest must come next
                for k in range(1, min(len(breaker) - 1, len(word)) + 1):
                    if word.endswith(breaker[:k]):
                        add(token, tuple(tokenize(breaker[k:])[:MAX_TAIL_TOKENS]))
        return cls({t: tuple(tails) for t, tails in heads.items()})

    @classmethod
    def for_tokenizer(cls, breakers: Sequence[str], tokenizer: Any) -> DryBreakers:
        """The token form of ``breakers`` for a :class:`tessera.text.tokenizer.Tokenizer`
        (a pass over its whole vocabulary)."""
        pieces = [tokenizer.token_to_piece(i) for i in range(tokenizer.n_vocab)]
        return cls.from_strings(
            breakers, pieces, lambda text: tokenizer.encode(text, add_special=False)
        )

    def is_single_token(self, token: int) -> bool:
        return () in self.heads.get(token, ())


def _repeat_limit(window: np.ndarray, breakers: DryBreakers) -> int:
    """How many tokens back a repetition may reach: up to the latest complete breaker."""
    n = len(window)
    for i in range(n):  # i tokens back from the end
        tails = breakers.heads.get(int(window[n - 1 - i]))
        if not tails:
            continue
        # the tail follows the head in time, so it sits in the i tokens after it
        fits = [len(t) for t in tails if len(t) <= i and _follows(window, n - 1 - i, t)]
        if fits:
            return i - max(fits)
    return n


def _follows(window: np.ndarray, head: int, tail: tuple[int, ...]) -> bool:
    return tuple(int(t) for t in window[head + 1 : head + 1 + len(tail)]) == tail


def _match_lengths(window: np.ndarray, limit: int) -> np.ndarray:
    """For each position ``j`` before the last, the length (at most ``limit``) of the
    longest stretch ending at ``j`` that equals the stretch ending at the last token."""
    last = len(window) - 1
    lengths = np.zeros(last, dtype=np.int64)
    alive = np.arange(last)
    for m in range(limit):  # one step back for every candidate end at once
        alive = alive[alive - m >= 0]
        alive = alive[window[alive - m] == window[last - m]]
        if not alive.size:
            break
        lengths[alive] += 1
    return lengths


def dry_penalty(
    logits: np.ndarray,
    history: Sequence[int],
    multiplier: float,
    base: float,
    allowed_length: int,
    last_n: int,
    breakers: DryBreakers | None = None,
) -> np.ndarray:
    """``logits`` with DRY's penalty subtracted (a copy; the input when nothing applies).

    ``last_n`` tokens of ``history`` are scanned (-1: all of it).
    """
    if multiplier == 0.0 or base < 1.0 or last_n == 0:
        return logits
    breakers = breakers or DryBreakers()
    window = np.asarray(history if last_n < 0 else history[-last_n:], dtype=np.int64)
    if len(window) <= allowed_length:
        return logits
    limit = _repeat_limit(window, breakers)
    if limit < allowed_length:
        return logits
    lengths = _match_lengths(window, limit)
    ends = np.flatnonzero(lengths >= allowed_length)
    if not ends.size:
        return logits
    # the token after each matching end would extend that repetition by one
    followers = window[ends + 1]
    longest: dict[int, int] = {}
    for token, n in zip(followers.tolist(), lengths[ends].tolist(), strict=True):
        if n > longest.get(token, -1):
            longest[token] = n
    max_exponent = int(_F32_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = logits.copy()
    for token, n in longest.items():
        if token >= len(out) or breakers.is_single_token(token):
            continue
        exponent = n - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        out[token] -= multiplier * base**exponent
    return out

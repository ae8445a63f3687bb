"""llama.cpp's PLaMo-2 tokenizer: the cheapest segmentation by integer token scores.

Each non-byte token scores ``round(score * 1e4)``; the segmentation of the text (after a
leading byte-order mark is dropped) maximizes the sum, found from the end of the text back,
where among equal sums the longer token at a position wins. A code point no token covers
costs 10^7 and is spelled with its UTF-8 byte tokens (``<0x00>`` ... ``<0xFF>``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tessera.text.prefix_matcher import PrefixMatcher
from tessera.text.vocab import TokenAttr, TokenizerError

_UNKNOWN_SCORE = -10_000_000


def _round_half_away(x: float) -> int:
    """C's ``round``: halves go away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


class Plamo2Model:
    """Text -> ids the way llama.cpp's PLaMo-2 session does it."""

    def __init__(
        self, tokens: Sequence[str], scores: Sequence[float], attrs: Sequence[int]
    ) -> None:
        self._bytes = [0] * 256  # llama.cpp takes id 0 as "not set"
        pieces: dict[str, float] = {}
        byte = int(TokenAttr.BYTE)
        for tid, (text, score, attr) in enumerate(zip(tokens, scores, attrs, strict=False)):
            if attr & byte:
                if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
                    try:
                        self._bytes[int(text[3:5], 16)] = tid
                    except ValueError:
                        pass
                continue
            pieces[text] = score
        if 0 in self._bytes:
            missing = self._bytes.index(0)
            raise TokenizerError(
                f"the PLaMo-2 vocabulary has no byte token <0x{missing:02X}>; convert it again"
            )
        ids = {text: tid for tid, text in enumerate(tokens)}  # the last of equal texts wins
        self._matcher = PrefixMatcher(
            (text, ids[text]) for text, score in pieces.items() if math.isfinite(score)
        )
        self._score = {
            ids[text]: _round_half_away(score * 1e4)
            for text, score in pieces.items()
            if math.isfinite(score)
        }

    def encode(self, text: str, after_special: bool) -> list[int]:
        if text.startswith("\ufeff"):
            text = text[1:]
        n = len(text)
        cost = [1 << 60] * (n + 1)
        cost[n] = 0
        step = [(1, -1)] * (n + 1)  # (length, token id or -1 for byte fallback)
        for i in range(n - 1, -1, -1):
            options = [(ln, tid, self._score[tid]) for ln, tid in self._matcher.matches(text, i)]
            best = cost[i]
            for length, tid, score in reversed(options):  # longest first: it wins a tie
                c = cost[i + length] - score
                if c < best:
                    best, step[i] = c, (length, tid)
                if score == _UNKNOWN_SCORE:
                    break
            else:
                c = cost[i + 1] - _UNKNOWN_SCORE
                if c < best:
                    best, step[i] = c, (1, -1)
            cost[i] = best
        out: list[int] = []
        pos = 0
        while pos < n:
            length, tid = step[pos]
            if tid >= 0:
                out.append(tid)
            else:
                out += [self._bytes[b] for b in text[pos].encode("utf-8", "surrogatepass")]
            pos += length
        return out

"""The vocabulary tokens that start at a position of a text: what llama.cpp finds by walking a
trie of the tokens, found here by looking up the substrings of the lengths tokens have."""

from __future__ import annotations

from collections.abc import Iterable

_KEY = 3  # tokens this long or longer are indexed by their first three characters


class PrefixMatcher:
    """Tokens by text, with the lengths of the tokens that begin with each 3-character key."""

    def __init__(self, items: Iterable[tuple[str, int]]) -> None:
        self._ids: dict[str, int] = {}
        for text, tid in items:
            if text:
                self._ids[text] = tid  # a later token with the same text wins, as in a trie
        lengths: dict[str, set[int]] = {}
        for text in self._ids:
            if len(text) >= _KEY:
                lengths.setdefault(text[:_KEY], set()).add(len(text))
        self._lengths = {key: sorted(ls) for key, ls in lengths.items()}

    def matches(self, text: str, pos: int) -> list[tuple[int, int]]:
        """``(length, id)`` of every token that ``text[pos:]`` starts with, shortest first."""
        ids, end = self._ids, len(text) - pos
        short = range(1, min(_KEY, end + 1))
        out = [(n, ids[text[pos : pos + n]]) for n in short if text[pos : pos + n] in ids]
        for n in self._lengths.get(text[pos : pos + _KEY], ()):
            if n > end:
                break
            tid = ids.get(text[pos : pos + n])
            if tid is not None:
                out.append((n, tid))
        return out

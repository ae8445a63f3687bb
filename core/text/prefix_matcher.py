"""The vocabulary tokens that start at a position of a text: what llama.cpp finds by walking a
trie of the tokens, found here by looking up the substrings of the lengths tokens have."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class PrefixMatcher:
    """Tokens by text, with the lengths the tokens starting with each character have."""

    def __init__(self, items: Iterable[tuple[str, int]]) -> None:
        self._ids: dict[str, int] = {}
        lengths: dict[str, set[int]] = {}
        for text, tid in items:
            if text:
                self._ids[text] = tid  # a later token with the same text wins, as in a trie
                lengths.setdefault(text[0], set()).add(len(text))
        self._lengths: Mapping[str, tuple[int, ...]] = {
            c: tuple(sorted(ls)) for c, ls in lengths.items()
        }

    def matches(self, text: str, pos: int) -> list[tuple[int, int]]:
        """``(length, id)`` of every token that ``text[pos:]`` starts with, shortest first."""
        out = []
        ids, end = self._ids, len(text) - pos
        for n in self._lengths.get(text[pos], ()):
            if n > end:
                break
            tid = ids.get(text[pos : pos + n])
            if tid is not None:
                out.append((n, tid))
        return out

    def longest(self, text: str, pos: int) -> tuple[int, int] | None:
        """``(length, id)`` of the longest token ``text[pos:]`` starts with, or None."""
        found = self.matches(text, pos)
        return found[-1] if found else None

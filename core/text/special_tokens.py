"""The special tokens cut out of raw text before tokenizing, and which of them a text holds.

llama.cpp tries every special token (control, user-defined, unknown) against the text,
longest first. A vocabulary padded with user-defined tokens (Qwen2's 151,936 ids hold
~148k ``<|pad_N|>``) makes that a loop over every one of them for each encode; here the
tokens are grouped by their first character and a text is searched only for the groups
whose character it contains: small groups token by token, large ones by looking up the
substrings of the group's lengths at each place the character occurs.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import attrs
import numpy as np

from tessera.text.vocab import SPECIAL


@attrs.frozen
class _Group:
    """The special tokens that start with one character."""

    lengths: tuple[int, ...]  # the distinct lengths (in characters) of the group's tokens
    texts: tuple[str, ...] | None  # the tokens themselves, kept for small groups only


_SMALL = 64  # groups up to this size keep their texts and may be tested token by token


class SpecialTokens:
    """The special tokens of a vocabulary, indexed by first character.

    ``tokens`` are the vocabulary's (non-empty) texts and ``bits`` their attribute bits;
    the tokens with a :data:`~tessera.text.vocab.SPECIAL` bit are indexed. Of several special
    tokens with the same text the lowest id is the one found."""

    def __init__(self, tokens: Sequence[str], bits: Sequence[int]) -> None:
        ids = np.flatnonzero(np.asarray(bits, dtype=np.int64) & SPECIAL).tolist()
        texts = [tokens[i] for i in ids]
        self._tokens = tokens
        self._by_text = dict(zip(reversed(texts), reversed(ids), strict=True))  # the first id wins
        self._groups: dict[str, _Group] = {}
        if not texts:
            return
        firsts = np.fromiter(map(ord, map(itemgetter(0), texts)), np.int64, len(texts))
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        order = np.argsort(firsts, kind="stable")
        codes, starts, counts = np.unique(firsts[order], return_index=True, return_counts=True)
        for code, start, count in zip(
            codes.tolist(), starts.tolist(), counts.tolist(), strict=True
        ):
            members = order[start : start + count]
            small = tuple(texts[i] for i in members.tolist()) if count <= _SMALL else None
            self._groups[chr(code)] = _Group(tuple(np.unique(lengths[members]).tolist()), small)

    def in_text(self, text: str) -> list[int]:
        """Ids of the special tokens that occur in ``text``, in llama.cpp's cutting order:
        longest (in UTF-8 bytes) first, then by id."""
        found: set[int] = set()
        by_text = self._by_text
        for first in self._groups.keys() & set(text):
            group = self._groups[first]
            places = text.count(first)
            if group.texts is not None and len(group.texts) <= places * len(group.lengths):
                found.update(by_text[t] for t in group.texts if t in text)
                continue
            pos = text.find(first)
            while pos >= 0:
                for n in group.lengths:
                    tid = by_text.get(text[pos : pos + n])
                    if tid is not None:
                        found.add(tid)
                pos = text.find(first, pos + 1)
        tokens = self._tokens
        return sorted(found, key=lambda i: (-len(tokens[i].encode()), i))

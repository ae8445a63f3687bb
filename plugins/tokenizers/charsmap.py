"""SentencePiece's precompiled normalization map (``tokenizer.ggml.precompiled_charsmap``).

The blob is a little-endian ``uint32`` size, a double-array trie of that many bytes (darts-clone
units: a BASE offset, an 8-bit LCHECK label, a LEAF bit), then the NUL-terminated replacement
strings the leaves point at. Normalizing replaces, at each position, the longest input prefix
the trie holds by its replacement, as llama.cpp's UGM tokenizer does.
"""

from __future__ import annotations

import numpy as np

from tessera.text.vocab import TokenizerError


class Charsmap:
    """Longest-prefix replacement over UTF-8 bytes by a precompiled charsmap."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) < 4:
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap is shorter than its header")
        size = int.from_bytes(blob[:4], "little")
        if size + 4 >= len(blob):
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap is truncated")
        self._units = np.frombuffer(blob[4 : 4 + size], dtype="<u4").tolist()
        self._replacements = blob[4 + size :]
        root = self._base(0)
        #: the bytes some key starts with (any other byte is copied as it is)
        self.first_bytes = frozenset(b for b in range(1, 256) if self._child(root, b) is not None)

    def _unit(self, index: int) -> int:
        if index >= len(self._units):
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap: index out of bounds")
        return self._units[index]

    def _base(self, index: int) -> int:
        unit = self._unit(index)
        return (unit >> 10) << ((unit & (1 << 9)) >> 6)

    def _child(self, node: int, byte: int) -> int | None:
        index = node ^ byte
        if index >= len(self._units):
            return None
        return index if self._units[index] & ((1 << 31) | 0xFF) == byte else None

    def longest_match(self, data: bytes, pos: int) -> tuple[int, bytes] | None:
        """``(length, replacement)`` of the longest trie key ``data[pos:]`` starts with."""
        node = self._base(0)
        best = None
        for end in range(pos, len(data)):
            byte = data[end]
            if byte == 0:
                break
            index = self._child(node, byte)
            if index is None:
                break
            unit = self._unit(index)
            node = index ^ self._base(index)
            if (unit >> 8) & 1:
                best = (end - pos + 1, self._unit(node) & ((1 << 31) - 1))
        if best is None:
            return None
        length, offset = best
        stop = self._replacements.find(b"\0", offset)
        if offset >= len(self._replacements) or stop < 0:
            raise TokenizerError("tokenizer.ggml.precompiled_charsmap: bad replacement offset")
        return length, self._replacements[offset:stop]

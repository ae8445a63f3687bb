"""The two BPE tokenizer models llama.cpp wraps around its BPE session: ``whitespace`` (text
cut at whitespace, optionally lowercased, each piece BPE'd) and ``hybriddna`` (DNA between
``<dna>`` and ``</dna>`` read as 6-mers, the rest BPE'd)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tessera.text.bpe import BpeModel
from tessera.text.unicode_classes import WHITESPACE_CODEPOINTS

_WHITESPACE_RUN = re.compile("[" + "".join(map(chr, WHITESPACE_CODEPOINTS)) + "]+")
DNA_KMER_MARKER = "\ue000"  # keeps a k-mer's id apart from the BPE token of the same letters
_KMER = 6


def _lower(text: str) -> str:
    # llama.cpp maps each code point to one lowercase code point
    return "".join(low if len(low := c.lower()) == 1 else low[0] for c in text)


class WhitespaceModel:
    """llama.cpp's whitespace session (jina-embeddings-v2-base-zh)."""

    def __init__(self, bpe: BpeModel, lowercase: bool) -> None:
        self._bpe, self._lowercase = bpe, lowercase

    def encode(self, text: str, after_special: bool) -> list[int]:
        out: list[int] = []
        for segment in _WHITESPACE_RUN.split(text):
            if segment:
                out += self._bpe.encode(_lower(segment) if self._lowercase else segment)
        return out


class HybridDnaModel:
    """llama.cpp's hybriddna session: BPE outside ``<dna>...</dna>``, 6-mers inside."""

    def __init__(self, bpe: BpeModel, ids: Mapping[str, int]) -> None:
        self._bpe, self._ids = bpe, ids
        self._tags = (ids.get("<dna>"), ids.get("</dna>"), ids.get("<oov>"))

    def encode(self, text: str, after_special: bool) -> list[int]:
        begin, end, oov = self._tags
        if begin is None or end is None or oov is None:
            return self._bpe.encode(text)
        out: list[int] = []
        pos = 0
        while pos < len(text):
            start = text.find("<dna>", pos)
            if start < 0:
                out += self._bpe.encode(text[pos:])
                break
            out += self._bpe.encode(text[pos:start])
            out.append(begin)
            content = start + len("<dna>")
            stop = text.find("</dna>", content)
            out += self._kmers(text[content : len(text) if stop < 0 else stop], oov)
            if stop < 0:
                break
            out.append(end)
            pos = stop + len("</dna>")
        return out

    def _kmers(self, sequence: str, oov: int) -> list[int]:
        # llama.cpp cuts bytes, not characters, and upper-cases ASCII letters only
        seq = sequence.encode("utf-8", "surrogatepass").upper()
        kmers = [seq[i : i + _KMER] for i in range(0, len(seq), _KMER)]
        if kmers and len(kmers[-1]) < _KMER:
            kmers[-1] = kmers[-1].ljust(_KMER, b"A")  # llama.cpp pads the last one with A
        texts = (k.decode("utf-8", "surrogateescape") + DNA_KMER_MARKER for k in kmers)
        return [self._ids.get(t, oov) for t in texts]

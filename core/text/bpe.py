"""llama.cpp's BPE tokenizer: pre-split the text, then merge each piece by the merge ranks.

The merging is the Hugging Face ``tokenizers`` BPE model (lowest rank first, leftmost on a
tie, as llama.cpp merges), run one piece at a time and remembered per piece, since real text
repeats its words. Pieces are GPT-2 byte-level characters by default; SentencePiece-style
vocabularies (Gemma 4) merge raw UTF-8 with ``<0xXX>`` byte tokens as the fallback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tessera.text.pre import PreTokenizer
from tessera.text.pre_split import Splitter
from tessera.text.vocab import SPACE_MARKER, TokenizerError

if TYPE_CHECKING:
    from tokenizers.models import BPE

_CACHE_LIMIT = 1 << 16  # pieces remembered before the cache starts over


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values onto printable unicode characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _byte_to_char()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# str.translate table from a piece's UTF-8 bytes (read as latin-1) to byte-level characters
_BYTE_LEVEL = str.maketrans({chr(b): c for b, c in BYTE_TO_CHAR.items()})


def parse_merges(
    merges: Sequence[str] | None, ids: Mapping[str, int], required: bool = True
) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` as pairs, in rank order (the first of duplicates wins)."""
    if not merges:
        if required:
            raise TokenizerError(
                "the BPE vocabulary has no tokenizer.ggml.merges; convert the model again"
            )
        return []
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)  # llama.cpp splits at the first space after the first char
        if cut < 0:
            continue
        left, right = merge[:cut], merge[cut + 1 :]
        # HF's BPE needs every part and product in the vocabulary; llama.cpp would fall back
        # to bytes for a product that is not, which no real vocabulary relies on
        if left in ids and right in ids and left + right in ids:
            pairs.append((left, right))
    return list(dict.fromkeys(pairs))  # the first of duplicates wins, as in llama.cpp


class BpeModel:
    """Text -> ids the way llama.cpp's BPE session does it for one pre-tokenizer."""

    def __init__(
        self, ids: Mapping[str, int], merges: list[tuple[str, str]], pre: PreTokenizer
    ) -> None:
        from tokenizers import models

        self.pre = pre
        self._splitter = Splitter(pre.regexes)
        self._model: BPE = models.BPE(
            dict(ids), merges, ignore_merges=pre.ignore_merges, byte_fallback=not pre.byte_encode
        )
        self._ids = ids
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str, after_special: bool = False) -> list[int]:
        """The ids of one fragment of raw text (special tokens already cut out)."""
        if self.pre.escape_whitespaces:
            text = text.replace(" ", SPACE_MARKER)
        return self.encode_pieces(self._splitter.split(text))

    def encode_pieces(self, pieces: Sequence[str]) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                ids = cache[piece] = self._merge(piece)
            out += ids
        return out

    def _merge(self, piece: str) -> list[int]:
        if self.pre.byte_encode:
            piece = piece.encode("utf-8", "surrogatepass").decode("latin-1")
            piece = piece.translate(_BYTE_LEVEL)
        elif self.pre.newline_tokens and not piece.strip("\n") and piece in self._ids:
            return [self._ids[piece]]  # llama.cpp's Gemma 4 rule for runs of newlines
        return [t.id for t in self._model.tokenize(piece)]

"""The vocabulary models llama.cpp keeps close to their Hugging Face counterparts, rebuilt
with the ``tokenizers`` library: SentencePiece-style BPE over scores (``llama``) and WordPiece
(``bert``), with llama.cpp's text rules around them (the ``▁`` space marker and prefix space,
WPM's word splitting).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tessera.text.unicode_classes import WHITESPACE_CODEPOINTS
from tessera.text.vocab import SPACE_MARKER

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer


class SpmModel:
    """llama.cpp's SPM tokenizer: spaces become ``▁`` and a space is prefixed to the text at
    the start and after every special token (when ``add_space_prefix``)."""

    def __init__(
        self,
        tokens: Sequence[str],
        ids: Mapping[str, int],
        scores: Sequence[float],
        unk_id: int | None,
        add_space_prefix: bool,
    ) -> None:
        self._hf = spm_bpe(tokens, ids, scores, unk_id)
        self._prefix = add_space_prefix

    def encode(self, text: str, after_special: bool) -> list[int]:
        if self._prefix and after_special:
            text = " " + text
        return self._hf.encode(text.replace(" ", SPACE_MARKER), add_special_tokens=False).ids


class WpmModel:
    """llama.cpp's WPM (BERT) tokenizer: normalized words, then WordPiece on each."""

    def __init__(
        self, ids: Mapping[str, int], unk_id: int | None, lowercase: bool, strip_accents: bool
    ) -> None:
        self._hf = wordpiece(ids, unk_id)
        self._lowercase, self._strip_accents = lowercase, strip_accents

    def encode(self, text: str, after_special: bool) -> list[int]:
        words = wpm_words(text, self._lowercase, self._strip_accents)
        if not words:
            return []
        return self._hf.encode(words, is_pretokenized=True, add_special_tokens=False).ids


def spm_bpe(
    tokens: Sequence[str], ids: Mapping[str, int], scores: Sequence[float], unk_id: int | None
) -> HFTokenizer:
    """BPE that merges like llama.cpp's SPM tokenizer, falling back to byte tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    unk = tokens[unk_id] if unk_id is not None else None
    merges = _spm_merges(tokens, scores, ids)
    return HFTokenizer(models.BPE(dict(ids), merges, unk_token=unk, byte_fallback=True))


def wordpiece(ids: Mapping[str, int], unk_id: int | None) -> HFTokenizer:
    """WordPiece over a llama.cpp WPM vocabulary (run it on :func:`wpm_words` output)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    # llama.cpp's vocab marks word starts with ▁; WordPiece marks the rest with ##
    vocab = {(t[1:] if t.startswith(SPACE_MARKER) else "##" + t): i for t, i in ids.items()}
    unk_id = unk_id if unk_id is not None else 0
    unk = next(k for k, v in vocab.items() if v == unk_id)
    return HFTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=1 << 30))


def _spm_merges(
    tokens: Sequence[str], scores: Sequence[float], ids: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Merges that make HF's BPE behave like llama.cpp's SPM tokenizer.

    llama.cpp repeatedly merges the adjacent pair whose concatenation is the vocabulary token
    with the highest score. Every split of every token into two vocabulary tokens is such a
    pair; ranking them by the merged token's score gives BPE the same choice at each step.
    """
    ranked = []
    for tid, text in enumerate(tokens):
        if ids.get(text) != tid:
            continue
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in ids and right in ids:
                ranked.append((-scores[tid], tid, k, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


# -- BERT (WPM) normalization, as llama.cpp's WPM preprocess does it --------------------------

_WHITESPACE = frozenset(map(chr, WHITESPACE_CODEPOINTS))
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _is_cjk(cp: int) -> bool:
    # most text is below the first CJK block: skip the range scan for it
    return cp >= 0x3400 and any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


#: ASCII control characters that are not whitespace: dropped without splitting a word.
_ASCII_CONTROLS = dict.fromkeys([*range(0x00, 0x09), *range(0x0E, 0x20), 0x7F])
#: On ASCII text (after dropping controls) a word is a run of letters and digits, and every
#: other non-whitespace character (all punctuation or symbols) stands alone.
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\t\n\x0b\x0c\r ]")


def wpm_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """Split text into words the way llama.cpp's WordPiece tokenizer does before matching."""
    if text.isascii():  # most input: one regex pass instead of a Python loop per character
        text = text.translate(_ASCII_CONTROLS)
        return _ASCII_WORD.findall(text.lower() if lowercase else text)
    return wpm_words_general(text, lowercase, strip_accents)


def wpm_words_general(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """:func:`wpm_words` for any text, one character at a time."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch in _WHITESPACE:
            if word:
                words.append("".join(word))
                word = []
            continue
        cat = unicodedata.category(ch)
        if ch in ("\0", "\ufffd") or cat[0] == "C" or (strip_accents and cat[0] == "M"):
            continue
        if lowercase:
            low = ch.lower()
            ch = low if len(low) == 1 else low[0]  # llama.cpp maps one code point to one
        cp = ord(ch)
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp):
            if word:
                words.append("".join(word))
                word = []
            words.append(ch)
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    return words

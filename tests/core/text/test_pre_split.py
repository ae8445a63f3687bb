"""llama.cpp's regex split, reproduced on collapsed text, against the ``regex`` module running
the tokenizer.json form of the same regexes on the real text (llama.cpp's hand-written GPT-2,
Llama 3 and Qwen2 splitters implement exactly those), and its translation rules."""

from __future__ import annotations

import random

import pytest
import regex

from tessera.text import pre_regexes as rx
from tessera.text.pre import HF_BYTE_LEVEL_REGEX
from tessera.text.pre_split import DigitGroups, Splitter, translate
from tessera.text.unicode_classes import collapse

_HF = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
ORACLES = {
    rx.GPT2_REGEX: HF_BYTE_LEVEL_REGEX,  # llama.cpp's GPT-2 splitter adds the lone \s+
    rx.LLAMA3_REGEX: _HF % "{1,3}" + _TAIL,
    rx.QWEN2_REGEX: _HF % "" + _TAIL,
}
# characters from every category, whitespace of every kind, contractions' pieces
ALPHABET = list("aZé'sStTlLdDrReEvVmM 0123456789\t\n\r\u3000\u00a0\u0085.,!?-/$+<=>_()")
ALPHABET += list("你好ą\u0301\u0308²½Ⅻ€©🦙\u200b\ue000ß")


def _pieces(pattern: str, text: str) -> list[str]:
    """Matches and the text between them, as a split with 'isolated' behavior gives them."""
    out, prev = [], 0
    for m in regex.finditer(pattern, text):
        out += [text[prev : m.start()]] if m.start() > prev else []
        out += [m.group()] if m.end() > m.start() else []
        prev = m.end()
    return out + ([text[prev:]] if prev < len(text) else [])


@pytest.mark.parametrize("llama_cpp_regex", list(ORACLES))
def test_hand_written_splitters_match_the_true_regex(llama_cpp_regex: str) -> None:
    rng = random.Random(7)
    splitter = Splitter([llama_cpp_regex])
    for _ in range(400):
        text = "".join(rng.choices(ALPHABET, k=rng.randint(0, 40)))
        assert splitter.split(text) == _pieces(ORACLES[llama_cpp_regex], text), repr(text)


def test_each_regex_cuts_only_inside_the_pieces_before_it() -> None:
    # starcoder: digits alone first, then GPT-2 on what is between: " 12" is not " 1", "2"
    assert Splitter(rx.STARCODER).split("a 12b") == ["a", " ", "1", "2", "b"]


def _digit_groups_reference(text: str) -> list[str]:
    """llama.cpp's AFMoE digit loop, one code point at a time."""
    out, prev, pos = [], 0, 0
    while pos < len(text):
        if collapse(text[pos]) in "0123456789\xd1":
            start = pos
            while pos < len(text) and collapse(text[pos]) in "0123456789\xd1":
                pos += 1
            cut = start + (pos - start) % 3
            for end in ([cut] if cut > start else []) + list(range(cut + 3, pos + 1, 3)):
                out.append(text[prev:end])
                prev = end
        else:
            pos += 1
    return out + ([text[prev:]] if prev < len(text) else [])


def test_digit_groups_cut_from_the_right_and_keep_the_text_before() -> None:
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choices(list("0123456789 ab²١"), k=rng.randint(0, 20)))
        spans = DigitGroups().split(collapse(text), [(0, len(text))])
        assert [text[a:b] for a, b in spans] == _digit_groups_reference(text), repr(text)


def test_translate_rewrites_categories_groups_and_the_end_anchor() -> None:
    assert translate(r"\p{N}+|[^\s\p{L}]", True) == "[\xd10-9]+|[^\\s\xd2\xd7A-Za-z]"
    assert translate(r"(IMG)(A|B){1,4}\s+$", False) == r"(?:IMG)(?:A|B){1,4}\s+\Z"
    assert translate(r"[$(]\(", False) == r"[$(]\("

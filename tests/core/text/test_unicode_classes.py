"""The collapsed text llama.cpp's pre-tokenizer regexes run on, against the Unicode database
of the ``regex`` module (a newer Unicode than llama.cpp's 15.1) and Python's."""

from __future__ import annotations

import unicodedata

import regex

from tessera.text import unicode_classes as uc

_MAJOR = {"L": uc.LETTER, "N": uc.NUMBER, "P": uc.PUNCTUATION, "M": uc.MARK, "S": uc.SYMBOL}
_ALL = "".join(map(chr, range(0x110000)))


def _oracle_major() -> list[str]:
    """Each code point's major category by the regex module ("C" for none of L N P M S Z)."""
    major = ["C"] * 0x110000
    for cat in "LNPMSZ":
        for m in regex.finditer(rf"\p{{{cat}}}+", _ALL):
            major[m.start() : m.end()] = cat * (m.end() - m.start())
    return major


def test_every_code_point_collapses_to_its_category() -> None:
    collapsed = uc.collapse(_ALL)
    assert len(collapsed) == len(_ALL)
    major = _oracle_major()
    whitespace = {m.start() for m in regex.finditer(r"\p{White_Space}", _ALL)}
    han = {cp for lo, hi in uc.HAN_RANGES for cp in range(lo, hi + 1)}
    newer_than_python = []
    for cp, got in enumerate(collapsed):
        if cp < 128:
            assert got == chr(cp)
        elif cp in whitespace:
            assert got == uc.WHITESPACE, hex(cp)
        elif cp in han:
            want = uc.HAN_LETTER if major[cp] == "L" else uc.HAN_OTHER
            assert got == want or unicodedata.category(chr(cp)) == "Cn", hex(cp)
        elif got != _MAJOR.get(major[cp], uc.OTHER):
            newer_than_python.append(cp)
    # what differs is what Unicode assigned after Python's database: unassigned for llama.cpp
    # unless Unicode 15.0/15.1 added it (llama.cpp's tables are 15.1)
    assert all(unicodedata.category(chr(cp)) == "Cn" for cp in newer_than_python)
    assert all(collapsed[cp] == uc.OTHER for cp in newer_than_python)


def test_unicode_15_characters_have_their_categories() -> None:
    # Kawi (15.0) signs and letters, CJK extension I (15.1), a 16.0 letter llama.cpp lacks
    assert uc.collapse("\U00011f00\U00011f04\U0002ebf0\u1c89") == (
        uc.MARK + uc.LETTER + uc.LETTER + uc.OTHER
    )


def test_widen_only_replaces_non_ascii_whitespace() -> None:
    text = "a\u3000b\u00a0c\t\x85d é 你"
    assert uc.widen(text) == "a\vb\vc\t\vd é 你"
    assert uc.widen("plain") == "plain"

"""Text as llama.cpp's pre-tokenizer regexes see it: one class character per code point.

llama.cpp runs most ``tokenizer.ggml.pre`` regexes with C++ ``std::regex``, which knows no
Unicode categories. It therefore "collapses" the text: a code point below 128 stays itself,
any other becomes one byte naming its category (letter, number, punctuation, mark, symbol,
other; non-ASCII whitespace becomes ``\\v``), and ``\\p{L}`` in a regex becomes a class of
that byte plus ``A-Za-z``. :func:`collapse` builds the same text, so a Python regex written
against these class characters splits exactly where llama.cpp splits, and since the result
has one character per code point its match offsets index the original text directly.

The categories come from Python's Unicode database, completed with the characters Unicode
15.0 and 15.1 added (llama.cpp's tables are Unicode 15.1).
"""

from __future__ import annotations

import unicodedata
from functools import cache

import numpy as np

OTHER = "\xd0"  # control, format, private use, unassigned
NUMBER = "\xd1"
LETTER = "\xd2"
PUNCTUATION = "\xd3"
MARK = "\xd4"
SYMBOL = "\xd5"
HAN_LETTER = "\xd7"  # a Han letter: a letter everywhere, and Kimi-K2's \p{Han}
HAN_OTHER = "\xd8"  # an unassigned code point in a Han block: "other", and \p{Han}
WHITESPACE = "\x0b"  # what llama.cpp puts for non-ASCII whitespace so \s matches it

#: The ASCII members and class characters of each category llama.cpp's regexes name, as the
#: body of a character class (\p{Lu}, \p{Ll} ... all mean any letter there).
CLASS_BODY = {
    "N": NUMBER + "0-9",
    "L": LETTER + HAN_LETTER + "A-Za-z",
    "P": PUNCTUATION + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": MARK,
    "S": SYMBOL + r"\$\+<-\>\^`\|~",
}

# White_Space code points (the set llama.cpp treats as whitespace).
WHITESPACE_CODEPOINTS = (
    *range(0x09, 0x0E),
    0x20,
    0x85,
    0xA0,
    0x1680,
    *range(0x2000, 0x200B),
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
)
# The code points llama.cpp counts as Han (unicode_cpt_is_han): CJK ideograph blocks.
HAN_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0x2CEB0, 0x2EBEF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# Characters Unicode 15.0 and 15.1 assigned (first, last, major category), for Python
# versions whose Unicode database is older.
_UNICODE_15_ADDITIONS = (
    (0x0CF3, 0x0CF3, "M"),
    (0x0ECE, 0x0ECE, "M"),
    (0x2FFC, 0x2FFF, "S"),
    (0x31EF, 0x31EF, "S"),
    (0x10EFD, 0x10EFF, "M"),
    (0x1123F, 0x11240, "L"),
    (0x11241, 0x11241, "M"),
    (0x11B00, 0x11B09, "P"),
    (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "L"),
    (0x11F03, 0x11F03, "M"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F34, 0x11F3A, "M"),
    (0x11F3E, 0x11F42, "M"),
    (0x11F43, 0x11F4F, "P"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),
    (0x13439, 0x1343F, "C"),
    (0x13440, 0x13440, "M"),
    (0x13441, 0x13446, "L"),
    (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"),
    (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"),
    (0x1E030, 0x1E06D, "L"),
    (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"),
    (0x1E4EC, 0x1E4EF, "M"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x1F6DC, 0x1F6DC, "S"),
    (0x1F774, 0x1F776, "S"),
    (0x1F77B, 0x1F77F, "S"),
    (0x1F7D9, 0x1F7D9, "S"),
    (0x1FA75, 0x1FA77, "S"),
    (0x1FA87, 0x1FA88, "S"),
    (0x1FAAD, 0x1FAAF, "S"),
    (0x1FABB, 0x1FABD, "S"),
    (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"),
    (0x1FADA, 0x1FADB, "S"),
    (0x1FAE8, 0x1FAE8, "S"),
    (0x1FAF7, 0x1FAF8, "S"),
    (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
_GENERAL_CATEGORIES = (
    "Lu Ll Lt Lm Lo Mn Mc Me Nd Nl No Pc Pd Ps Pe Pi Pf Po Sm Sc Sk So Zs Zl Zp Cc Cf Cs Co Cn"
).split()
_CODE = {"L": LETTER, "N": NUMBER, "P": PUNCTUATION, "M": MARK, "S": SYMBOL}
_N_CODEPOINTS = 0x110000


@cache
def _class_table() -> np.ndarray:
    """The class byte of every code point (built once, on the first non-ASCII text)."""
    codes = {cat: ord(_CODE.get(cat[0], OTHER)) for cat in _GENERAL_CATEGORIES}
    category = unicodedata.category
    table = np.fromiter(
        (codes[category(chr(cp))] for cp in range(_N_CODEPOINTS)), np.uint8, _N_CODEPOINTS
    )
    for first, last, major in _UNICODE_15_ADDITIONS:
        table[first : last + 1] = ord(_CODE.get(major, OTHER))
    for first, last in HAN_RANGES:
        block = table[first : last + 1]
        block[:] = np.where(block == ord(LETTER), ord(HAN_LETTER), ord(HAN_OTHER))
    table[list(WHITESPACE_CODEPOINTS)] = ord(WHITESPACE)
    table[:128] = np.arange(128)
    return table


def collapse(text: str) -> str:
    """``text`` with every code point from 128 up replaced by its class character."""
    if text.isascii():
        return text
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return _class_table()[cps].tobytes().decode("latin-1")


_NON_ASCII_WHITESPACE = dict.fromkeys((cp for cp in WHITESPACE_CODEPOINTS if cp > 127), WHITESPACE)


def widen(text: str) -> str:
    """``text`` as llama.cpp hands it to regexes without categories: non-ASCII whitespace
    becomes ``\\v`` (C++ ``\\s`` would not match it), everything else stays."""
    return text if text.isascii() else text.translate(_NON_ASCII_WHITESPACE)

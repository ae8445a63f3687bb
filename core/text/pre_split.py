"""llama.cpp's pre-tokenizer split (``unicode_regex_split``), reproduced with Python's ``re``.

A pre-tokenizer is a list of regexes applied in turn: each one cuts every piece the previous
ones left into its matches and the text between them (both kept, nothing dropped), and never
looks across a piece's ends. llama.cpp runs a regex that names Unicode categories on the
collapsed text (:mod:`tessera.text.unicode_classes`) with ``\\p{..}`` rewritten into class
characters, and any other regex on the text itself with non-ASCII whitespace made ``\\v``;
both run under ECMAScript rules, which ``re.ASCII`` reproduces for ``\\s \\d \\w \\b``.
A few regexes llama.cpp answers with hand-written code instead (GPT-2, Llama 3, Qwen2 and
Qwen3.5 ones behave exactly like the regex; Kimi-K2's and the digit groups of AFMoE and
Tiny Aya do not, so they get their own rules here).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import accumulate

from tessera.text.unicode_classes import (
    CLASS_BODY,
    HAN_LETTER,
    HAN_OTHER,
    LETTER,
    collapse,
    widen,
)
from tessera.text.vocab import TokenizerError

Spans = list[tuple[int, int]]

# The category names llama.cpp rewrites (every letter subcategory means "a letter" there).
_CATEGORIES = {"N": "N", "L": "L", "P": "P", "M": "M", "S": "S"} | {f"L{c}": "L" for c in "ultmo"}
_PROPERTY = re.compile(r"\\p\{(\w+)\}")

#: The trigger regexes of llama.cpp's hand-written splitters that differ from a regex.
KIMI_K2 = r"\p{Han}+"
AFMOE_DIGITS = r"\p{AFMoE_digits}"
TINY_AYA_DIGITS = r"\d{1,3}(?=(?:\d{3})*\b)"

_L, _N = CLASS_BODY["L"], CLASS_BODY["N"]
_LETTER_NOT_HAN = LETTER + "A-Za-z"
_CONTRACTION = r"(?:'[sStTmMdD]|'[rR][eE]|'[vV][eE]|'[lL][lL])"
# Kimi-K2's splitter: Han runs, words of non-Han letters with a contraction, up to three
# digits, punctuation runs, then whitespace the Llama 3 way (collapsed-text classes).
_KIMI_K2_PATTERN = (
    f"[{HAN_LETTER}{HAN_OTHER}]+"
    f"|[^\\r\\n{_L}{_N}{HAN_OTHER}]?[{_LETTER_NOT_HAN}]+{_CONTRACTION}?"
    f"|[{_N}]{{1,3}}"
    f"| ?[^\\s{_L}{_N}]+[\\r\\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class RegexSplit:
    """One llama.cpp regex, translated to Python and run on the text it would see."""

    def __init__(self, regex: str) -> None:
        self.collapsed = regex == KIMI_K2 or any(
            m.group(1) in _CATEGORIES for m in _PROPERTY.finditer(regex)
        )
        source = _KIMI_K2_PATTERN if regex == KIMI_K2 else translate(regex, self.collapsed)
        self._pattern = re.compile(source, re.ASCII)

    def split(self, text: str, spans: Spans) -> Spans:
        out: Spans = []
        findall, finditer = self._pattern.findall, self._pattern.finditer
        for start, end in spans:
            pieces = findall(text, start, end)
            # most pieces of a later step are one match, or none, of the whole piece
            if not pieces or (len(pieces) == 1 and len(pieces[0]) == end - start):
                out.append((start, end))
                continue
            lengths = list(accumulate(map(len, pieces), initial=start))
            if lengths[-1] == end:  # the matches tile the piece: no gaps to find
                out += [(a, b) for a, b in zip(lengths, lengths[1:], strict=False) if b > a]
                continue
            prev = start
            for m in finditer(text, start, end):
                a, b = m.span()
                if a > prev:
                    out.append((prev, a))
                if b > a:
                    out.append((a, b))
                prev = b
            if prev < end:
                out.append((prev, end))
        return out


class DigitGroups:
    """llama.cpp's AFMoE/Tiny Aya digit split: a run of digits is cut into groups of three
    from the right; the text before a run stays joined to the run's first group."""

    collapsed = True
    _run = re.compile(f"[{_N}]+")

    def split(self, text: str, spans: Spans) -> Spans:
        out: Spans = []
        for start, end in spans:
            prev = start
            for m in self._run.finditer(text, start, end):
                a, b = m.span()
                first = a + (b - a) % 3
                cuts = ([first] if first > a else []) + list(range(first + 3, b + 1, 3))
                for cut in cuts:
                    out.append((prev, cut))
                    prev = cut
            if prev < end:
                out.append((prev, end))
        return out


def translate(regex: str, collapsed: bool) -> str:
    """A llama.cpp (ECMAScript) regex as a Python one with the same matches.

    ``\\p{..}`` becomes the collapsed-text class when ``collapsed``; groups stop capturing
    (llama.cpp compiles with ``nosubs``, and ``findall`` must return whole matches); ``$``
    means the end of the piece only.
    """
    out: list[str] = []
    inside = False  # within [...]
    i = 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            prop = _PROPERTY.match(regex, i)
            if prop and collapsed and prop.group(1) in _CATEGORIES:
                body = CLASS_BODY[_CATEGORIES[prop.group(1)]]
                out.append(body if inside else f"[{body}]")
                i = prop.end()
                continue
            out.append(regex[i : i + 2])
            i += 2
            continue
        if inside:
            inside = c != "]"
        elif c == "[":
            inside = True
        elif c == "(" and not regex.startswith("(?", i):
            c = "(?:"
        elif c == "$":
            c = r"\Z"
        elif c == "^":
            raise TokenizerError(f"pre-tokenizer regex {regex!r}: '^' is not supported")
        out.append(c)
        i += 1
    return "".join(out)


class Splitter:
    """A pre-tokenizer's regexes in order: text in, the pieces BPE sees out."""

    def __init__(self, regexes: Sequence[str]) -> None:
        self._steps = [
            DigitGroups() if r in (AFMOE_DIGITS, TINY_AYA_DIGITS) else RegexSplit(r)
            for r in regexes
        ]
        self._kinds = {step.collapsed for step in self._steps}

    def split(self, text: str) -> list[str]:
        """The pieces of ``text``, in order, without empty ones."""
        if not text:
            return []
        views = {kind: collapse(text) if kind else widen(text) for kind in self._kinds}
        spans: Spans = [(0, len(text))]
        for step in self._steps:
            spans = step.split(views[step.collapsed], spans)
        return [text[a:b] for a, b in spans]

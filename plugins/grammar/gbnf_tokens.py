"""Token references of llama.cpp's GBNF dialect (``<[1000]>``, ``!<[1000]>``, ``<think>``)
carried through llguidance's GBNF-to-Lark conversion, which does not read them.

Before the conversion each reference becomes a placeholder rule (one that refers only to
itself, so the converter keeps every rule using it a grammar rule, not a lexer terminal:
llguidance takes tokens in grammar rules); after it, the placeholder rules are dropped and
each use is written in llguidance's Lark syntax: ``<[1000]>`` the token with id 1000,
``<[^1000]>`` any token but that one, ``<think>`` the special token of that text.
"""

from __future__ import annotations

import re

from tessera.contract.constraints import ConstraintSpecError

_PREFIX = "tesseratokenref"
#: A reference after its '<': a token id in brackets, or a token's text up to the '>'
_ID = re.compile(r"\[(\d+)\]>")
_TEXT = re.compile(r"([^\s<>\[\]]+)>")


def _skip_quoted(text: str, i: int, close: str) -> int:
    """The index after the literal or class opened at ``text[i]`` (backslash escapes)."""
    j = i + 1
    while j < len(text) and text[j] != close:
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _reference(text: str, i: int, negated: bool) -> tuple[str, int]:
    """The Lark form of the reference whose '<' is at ``text[i]``, and the index after it."""
    found = _ID.match(text, i + 1)
    if found:
        token_id = found.group(1)
        return (f"<[^{token_id}]>" if negated else f"<[{token_id}]>"), found.end()
    found = _TEXT.match(text, i + 1)
    if found is None:
        raise ConstraintSpecError(
            f"the grammar has a '<' that starts no token reference at offset {i}; write a "
            'token as <[ID]> or <TEXT>, or the character as "<"'
        )
    if negated:
        raise ConstraintSpecError(
            f"the negated token !<{found.group(1)}> is not supported; name the token by its "
            "id, !<[ID]> (tessera tokenize shows the ids)"
        )
    return f"<{found.group(1)}>", found.end()


def extract_token_refs(grammar: str) -> tuple[str, dict[str, str]]:
    """``grammar`` with each token reference replaced by a placeholder rule (defined at its
    end), and the Lark form of each placeholder; the grammar itself when it has none."""
    prefix = _PREFIX
    while prefix in grammar:  # a placeholder never shadows a rule of the grammar
        prefix += "x"
    out: list[str] = []
    forms: dict[str, str] = {}
    i = start = 0
    while i < len(grammar):
        c = grammar[i]
        if c in '"[':
            i = _skip_quoted(grammar, i, '"' if c == '"' else "]")
        elif c == "#":
            end = grammar.find("\n", i)
            i = len(grammar) if end < 0 else end
        elif c == "<" or (c == "!" and grammar.startswith("<", i + 1)):
            negated = c == "!"
            form, end = _reference(grammar, i + 1 if negated else i, negated)
            name = next((n for n, f in forms.items() if f == form), f"{prefix}{len(forms)}")
            forms[name] = form
            out += [grammar[start:i], f" {name} "]
            i = start = end
        else:
            i += 1
    if not forms:
        return grammar, {}
    out.append(grammar[start:])
    out += [f"\n{name} ::= {name}" for name in forms]
    return "".join(out), forms


def insert_token_refs(lark: str, forms: dict[str, str]) -> str:
    """The converted grammar with the placeholder rules dropped and each use written as
    the token reference it stands for."""
    for name, form in forms.items():
        lark = re.sub(rf"(?m)^{name}: {name}\n", "", lark)
        lark = re.sub(rf"\b{name}\b", lambda _, form=form: form, lark)
    return lark

"""Each constraint kind's spec turned into llguidance's grammar form, with the spec's
problems reported in one sentence (:class:`ConstraintSpecError`) before any generation.

llguidance reads JSON schemas, regular expressions and Lark grammars; a llama.cpp GBNF
grammar goes through llguidance's own GBNF-to-Lark conversion (its token references by
way of :mod:`tessera.plugins.grammar.gbnf_tokens`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from tessera.contract.constraints import ConstraintSpecError
from tessera.plugins.grammar.gbnf_tokens import extract_token_refs, insert_token_refs

#: Whitespace between JSON tokens: at most 16 bytes in a row, so a model cannot loop on
#: spaces or newlines forever (16 still pretty-prints a few levels deep).
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}


def _checked(grammar: str, what: str) -> str:
    """``grammar`` if llguidance accepts it, else the refusal naming its error."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintSpecError(f"the {what} is not valid: {' '.join(messages[0].split())}")
    return grammar


def lark_source(lark: str, what: str = "Lark grammar") -> str:
    """A grammar in llguidance's Lark dialect."""
    from llguidance import LLMatcher

    try:
        return _checked(LLMatcher.grammar_from_lark(lark), what)
    except ValueError as exc:
        raise ConstraintSpecError(f"the {what} is not valid: {exc}") from None


def json_schema_source(schema: Any, what: str = "JSON schema") -> str:
    """A JSON schema (a dict, or its JSON text) as a grammar."""
    from llguidance import LLMatcher

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ConstraintSpecError(f"the {what} is not JSON: {exc}") from None
    if not isinstance(schema, Mapping):
        raise ConstraintSpecError(f"the {what} must be a JSON object, got {type(schema).__name__}")
    try:
        grammar = LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise ConstraintSpecError(f"the {what} is not valid: {exc}") from None
    return _checked(grammar, what)


def json_object_source(spec: Any = None) -> str:
    """Any JSON object (``response_format: json_object``)."""
    return json_schema_source({"type": "object"})


# \uXXXX and \UXXXXXXXX after an even number of backslashes (so not "\\u")
_UNICODE_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")


def _expand_unicode_escapes(grammar: str) -> str:
    """GBNF's ``\\u``/``\\U`` escapes as the character itself (``\\xHH`` for ASCII, which
    may be a quote or a bracket): llguidance's converter passes them on in a form its own
    lexer refuses."""

    def one(m: re.Match[str]) -> str:
        code = int(m.group(2) or m.group(3), 16)
        return m.group(1) + (f"\\x{code:02X}" if code < 0x80 else chr(code))

    return _UNICODE_ESCAPE.sub(one, grammar)


def gbnf_source(grammar: Any) -> str:
    """A llama.cpp GBNF grammar, token references (``<[ID]>``) included; a Lark grammar
    is read as is."""
    from llguidance.gbnf_to_lark import gbnf_to_lark, is_lark_syntax

    if not isinstance(grammar, str) or not grammar.strip():
        raise ConstraintSpecError("the grammar must be a non-empty GBNF text")
    text = _expand_unicode_escapes(grammar)
    if is_lark_syntax(text):
        return lark_source(text, "grammar")
    plain, tokens = extract_token_refs(text)
    try:
        lark = gbnf_to_lark(plain)
    except Exception as exc:  # the converter raises plain Exceptions for unknown rules
        raise ConstraintSpecError(
            f"the grammar is not valid: cannot convert it from GBNF to Lark: {exc}"
        ) from None
    return lark_source(insert_token_refs(lark, tokens), "grammar")


def regex_source(pattern: Any) -> str:
    """A regular expression (Rust ``regex`` syntax) the whole output must match."""
    from llguidance import LLMatcher

    if not isinstance(pattern, str) or not pattern:
        raise ConstraintSpecError("the regular expression must be a non-empty string")
    try:
        return _checked(LLMatcher.grammar_from_regex(pattern), "regular expression")
    except ValueError as exc:
        raise ConstraintSpecError(f"the regular expression is not valid: {exc}") from None


def choice_source(choices: Any) -> str:
    """One of a list of strings, exactly."""
    if (
        not isinstance(choices, list | tuple)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ConstraintSpecError("the choices must be a non-empty list of non-empty strings")
    return lark_source("start: " + " | ".join(json.dumps(c) for c in choices), "choice list")


#: Grammar source of each kind from its spec.
SOURCES: dict[str, Callable[[Any], str]] = {
    "json_object": json_object_source,
    "json_schema": json_schema_source,
    "gbnf": gbnf_source,
    "regex": regex_source,
    "choice": choice_source,
}

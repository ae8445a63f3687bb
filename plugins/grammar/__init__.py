"""Structured output on llguidance: the constraint kinds ``json_object``, ``json_schema``,
``gbnf`` (llama.cpp's grammar dialect), ``regex``, ``choice`` and ``tool_call``.

Registered through ``tessera_register_constraints``; callers reach the kinds through the
runtime's catalogue (``runtime.constraint_kind(name)``), never by importing this package.
One :class:`~tessera.plugins.grammar.library.GrammarLibrary` per registration holds the
per-tokenizer tables and the compiled grammars.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from tessera.contract.constraints import ConstraintKind
from tessera.hookspecs import hookimpl
from tessera.switches import Switch

TESSERA_PLUGIN_API = 2

DESCRIPTIONS = {
    "json_object": "any JSON object (response_format json_object, Ollama format json)",
    "json_schema": "JSON valid against a schema (response_format json_schema, guided_json)",
    "gbnf": "a llama.cpp GBNF grammar (grammar, guided_grammar)",
    "regex": "text matching a regular expression (guided_regex)",
    "choice": "exactly one of a list of strings (guided_choice)",
    "tool_call": "one call of a declared tool in the chat format's syntax (tool_choice)",
}


@hookimpl
def tessera_register_constraints(register: Callable[[ConstraintKind], None]) -> None:
    from tessera.plugins.grammar.library import GrammarLibrary
    from tessera.plugins.grammar.sources import SOURCES
    from tessera.plugins.grammar.tool_call import tool_call_source

    library = GrammarLibrary()
    for name, source in {**SOURCES, "tool_call": tool_call_source}.items():
        compile_kind = partial(library.compile, name, source)
        register(ConstraintKind(name=name, compile=compile_kind, description=DESCRIPTIONS[name]))


@hookimpl
def tessera_register_switches(register: Callable[[Switch], None]) -> None:
    from tessera.plugins.grammar.constraint import REJECTION

    register(REJECTION)

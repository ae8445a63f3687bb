"""The ``tool_call`` kind: output that is exactly one call of a declared tool, written in
the chat format's tool-call syntax, its arguments valid against the tool's JSON schema.

Spec: ``{"tools": [OpenAI tool declarations], "family": syntax name}``; the family is the
chat format's :class:`tessera.plugins.chat.tool_calls.ToolCallSyntax` name. The JSON of the
call goes through llguidance's JSON-schema compiler inside a Lark frame (``%json``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tessera.contract.constraints import ConstraintSpecError
from tessera.plugins.grammar.sources import JSON_OPTIONS, lark_source

# How each family frames one call: (text before the JSON, key of the arguments, text after).
FRAMES: dict[str, tuple[str, str, str]] = {
    "hermes": ("<tool_call>\n", "arguments", "\n</tool_call>"),
    "llama3-json": ("", "parameters", ""),
    "mistral": ("[TOOL_CALLS][", "arguments", "]"),
}


def _function(tool: Any) -> tuple[str, Mapping[str, Any]]:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ConstraintSpecError("each tool must be {type: function, function: {name, ...}}")
    parameters = function.get("parameters") or {"type": "object"}
    if not isinstance(parameters, Mapping):
        raise ConstraintSpecError(f"the parameters of tool {name!r} must be a JSON schema object")
    return name, parameters


def call_schema(tools: Any, arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call of any of ``tools``: its name, then its arguments."""
    if not isinstance(tools, list | tuple) or not tools:
        raise ConstraintSpecError("a forced tool call needs at least one tool in 'tools'")
    calls = []
    for name, parameters in map(_function, tools):
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, arguments_key: parameters},
                "required": ["name", arguments_key],
                "additionalProperties": False,
            }
        )
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, "x-guidance": JSON_OPTIONS}


def tool_call_source(spec: Any) -> str:
    """The grammar of one framed call (see the module docstring for ``spec``)."""
    if not isinstance(spec, Mapping):
        raise ConstraintSpecError("a tool_call spec is {tools: [...], family: name}")
    family = spec.get("family")
    if family not in FRAMES:
        raise ConstraintSpecError(
            f"tool calls cannot be forced in the {family or 'content-only'} chat format; "
            f"the formats that can are: {', '.join(FRAMES)}"
        )
    before, arguments_key, after = FRAMES[family]
    schema = json.dumps(call_schema(spec.get("tools"), arguments_key))
    parts = [json.dumps(before)] if before else []
    parts.append(f"%json {schema}")
    parts += [json.dumps(after)] if after else []
    return lark_source("start: " + " ".join(parts), "tool-call grammar")

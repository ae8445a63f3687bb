"""The output constraint a request asks for, compiled before any work.

OpenAI's ``response_format`` (``json_object``, ``json_schema``), llama-server's
``json_schema`` and ``grammar``, vLLM's ``guided_json``, ``guided_regex``,
``guided_choice`` and ``guided_grammar``, and a forced tool call (``tool_choice``) each
name a constraint kind of the runtime's catalogue (the ``grammar`` plugin registers
them). At most one may be given. A spec the kind refuses is a 400 naming the field and
the engine's message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from tessera.contract.constraint_fields import (
    ConstraintFieldError,
    compile_constraint,
    response_format_constraint,
)
from tessera.contract.routes import ApiError
from tessera.plugins.server.state import ServedModel

from .fields import Fields

# field -> the constraint kind its value is the spec of
_PLAIN_FIELDS = {
    "json_schema": "json_schema",
    "grammar": "gbnf",
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "gbnf",
}


def requested(f: Fields) -> list[tuple[str, str, Any]]:
    """Every constraint the request's declared fields ask for, as (field, kind, spec)."""
    asked = []
    if "response_format" in f.declared:
        found = response_format_constraint(f["response_format"])
        if found is not None:
            asked.append(("response_format", *found))
    for name, kind in _PLAIN_FIELDS.items():
        if name in f.declared and f[name] is not None:
            asked.append((name, kind, f[name]))
    return asked


def forced_tool_call(tools: Any, tool_choice: Any, family: str | None) -> dict[str, Any] | None:
    """The ``tool_call`` spec of ``tool_choice`` "required" (any declared tool) or
    ``{"type": "function", "function": {"name": ...}}`` (that one); None otherwise."""
    if not tools or tool_choice in (None, "auto", "none"):
        return None
    if tool_choice != "required":
        name = tool_choice["function"].get("name")
        tools = [t for t in tools if (t.get("function") or {}).get("name") == name]
        if not tools:
            raise ApiError(
                400, f"tool_choice names {name!r}, which is not among the tools", "tool_choice"
            )
    return {"tools": tools, "family": family}


async def constraint_factory(
    f: Fields, served: ServedModel, tool_call: Mapping[str, Any] | None = None
) -> Callable[[], Any] | None:
    """The per-generation constraint factory of the request (None: unconstrained)."""
    try:
        asked = requested(f)
        if tool_call is not None:
            asked.append(("tool_choice", "tool_call", tool_call))
        # the first compile for a vocabulary builds its tables (seconds for 150k tokens):
        # off the event loop; later ones hit the kind's cache
        return await asyncio.to_thread(compile_constraint, served.runtime, asked, served.tokenizer)
    except ConstraintFieldError as exc:
        raise ApiError(400, str(exc), exc.field) from None

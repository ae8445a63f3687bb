"""The ``tools`` and ``tool_choice`` of :meth:`tessera.LLM.chat`: the tools the chat
template is given, as the server gives them.

``tool_choice`` ``"auto"`` (or None) offers the tools to the model through its template,
``"none"`` keeps them out of the prompt. A call the model writes stays in the answer's
content: splitting it into OpenAI ``tool_calls`` is the chat plugin's parsing, which
``tessera serve`` runs; forcing one (``"required"``, a named function) is refused here.
"""

from __future__ import annotations

from typing import Any

from tessera.errors import TesseraError


def offered_tools(tools: Any, tool_choice: Any) -> list[dict] | None:
    """The tools to render into the prompt (None: none), after checking both keywords."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools):
        raise TesseraError(
            "tools must be a list of function tools, each "
            '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
        )
    if tool_choice is None or tool_choice == "auto":
        return tools or None
    if tool_choice == "none":
        return None
    raise TesseraError(
        f"tool_choice={tool_choice!r} would force a tool call, which LLM.chat does not do; "
        "give 'auto' or 'none', or use tessera serve's /v1/chat/completions"
    )


def _is_function_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str)

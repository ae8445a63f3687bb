"""How a model writes its reasoning and its tool calls, detected from its chat template.

A :class:`ChatFormat` names the reasoning markers (``<think>``/``</think>``, ``[THINK]``/
``[/THINK]``) and the :class:`ToolCallSyntax` of a template family. Built in:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes 2/3,
  Qwen 2.5, Qwen3, QwQ);
- ``llama3-json``: a bare ``{"name": ..., "parameters": {...}}`` object opening the answer, or
  one after ``<|python_tag|>`` (Llama 3.1/3.2/3.3);
- ``mistral``: ``[TOOL_CALLS]`` followed by a JSON list of calls (Mistral Nemo) or by
  ``name[ARGS]{...}`` (Mistral Small 3.2, Devstral, Ministral 3);
- ``deepseek``: ``<｜tool▁calls▁begin｜>`` ... ``<｜tool▁calls▁end｜>`` (DeepSeek R1, V3.1).

gpt-oss's harmony format (channels, recipients) is no marker syntax: a template that writes
``<|channel|>`` and ``<|message|>`` gets ``ChatFormat.harmony``, and its answers are parsed by
:class:`tessera.plugins.chat.harmony.HarmonyParser`.

A new family is a :class:`ToolCallSyntax` subclass passed to :func:`detect_chat_format`
(``syntaxes=``); see docs/chat.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from tessera.plugins.chat.tool_call_families import (
    DeepSeekSyntax,
    HermesSyntax,
    Llama3JsonSyntax,
    MistralSyntax,
)
from tessera.plugins.chat.tool_calls import ToolCallSyntax, json_value_end, partial_suffix

__all__ = [
    "BUILTIN_SYNTAXES",
    "ChatFormat",
    "ReasoningMarkers",
    "ToolCallSyntax",
    "detect_chat_format",
    "json_value_end",
    "partial_suffix",
]


@attrs.frozen
class ReasoningMarkers:
    """The text that opens and closes a model's reasoning."""

    start: str
    end: str


THINK_TAGS = ReasoningMarkers("<think>", "</think>")
MISTRAL_THINK = ReasoningMarkers("[THINK]", "[/THINK]")


BUILTIN_SYNTAXES: tuple[ToolCallSyntax, ...] = (
    HermesSyntax(),
    Llama3JsonSyntax(),
    MistralSyntax(),
    DeepSeekSyntax(),
)


@attrs.frozen
class ChatFormat:
    """What a model's answers contain besides plain text: reasoning markers and tool calls."""

    name: str
    reasoning: ReasoningMarkers | None = None
    tool_syntax: ToolCallSyntax | None = None
    #: gpt-oss's harmony messages (reasoning, content and tool calls by channel and
    #: recipient) instead of markers.
    harmony: bool = False


def detect_chat_format(
    template_source: str, syntaxes: Sequence[ToolCallSyntax] = BUILTIN_SYNTAXES
) -> ChatFormat:
    """The format of a chat template; the first syntax in ``syntaxes`` that matches wins."""
    if "<|channel|>" in template_source and "<|message|>" in template_source:
        return ChatFormat(name="harmony", harmony=True)
    reasoning = None
    for markers in (THINK_TAGS, MISTRAL_THINK):
        if markers.start in template_source and markers.end in template_source:
            reasoning = markers
            break
    tool_syntax = next((s for s in syntaxes if s.matches(template_source)), None)
    parts = [tool_syntax.name if tool_syntax else "content-only"]
    if reasoning is not None:
        parts.append(f"reasoning {reasoning.start}")
    return ChatFormat(name=", ".join(parts), reasoning=reasoning, tool_syntax=tool_syntax)

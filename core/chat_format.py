"""How a model writes its reasoning and its tool calls, detected from its chat template.

A :class:`ChatFormat` names the reasoning markers (``<think>``/``</think>``, ``[THINK]``/
``[/THINK]``) and the :class:`ToolCallSyntax` of a template family. Built in:

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes 2/3,
  Qwen 2.5, Qwen3, QwQ);
- ``llama3-json``: a bare ``{"name": ..., "parameters": {...}}`` object opening the answer, or
  one after ``<|python_tag|>`` (Llama 3.1/3.2/3.3);
- ``mistral``: ``[TOOL_CALLS]`` followed by a JSON list of calls (Mistral Nemo) or by
  ``name[ARGS]{...}`` (Mistral Small 3.2, Devstral, Ministral 3).

A new family is a :class:`ToolCallSyntax` subclass passed to :func:`detect_chat_format`
(``syntaxes=``); see docs/chat.md.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

import attrs

#: (name, arguments as a JSON string, id the model gave or None)
ParsedCall = tuple[str, str, "str | None"]


@attrs.frozen
class ReasoningMarkers:
    """The text that opens and closes a model's reasoning."""

    start: str
    end: str


THINK_TAGS = ReasoningMarkers("<think>", "</think>")
MISTRAL_THINK = ReasoningMarkers("[THINK]", "[/THINK]")


def partial_suffix(text: str, markers: Collection[str]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def json_value_end(text: str, start: int = 0) -> int | None:
    """Index just past the JSON object or array that begins at ``text[start:]`` (after blanks).

    None while the value is still open; -1 when no object or array begins there.
    """
    i = start
    while i < len(text) and text[i].isspace():
        i += 1
    if i == len(text):
        return None
    if text[i] not in "{[":
        return -1
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        ch = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def arguments_json(value: Any) -> str | None:
    """OpenAI's ``arguments`` string from what the model wrote (an object or a JSON string)."""
    if value is None:
        return "{}"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        return value
    return None


def _call_from_object(obj: Any, argument_keys: Sequence[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    value = next((obj[key] for key in argument_keys if key in obj), None)
    arguments = arguments_json(value)
    if arguments is None:
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return obj["name"], arguments, call_id


class ToolCallSyntax:
    """How one template family writes tool calls; subclass it to add a family.

    The session finds a call's start in the content with :meth:`find_start`, collects the text
    after the start marker (the *body*) until :meth:`find_end` says where the call ends, then
    asks :meth:`parse` for the calls in it. A body that does not parse is given back as text.
    """

    name: ClassVar[str] = ""
    start_markers: ClassVar[tuple[str, ...]] = ()

    def matches(self, template_source: str) -> bool:
        """Whether a chat template (its Jinja source) writes tool calls this way."""
        raise NotImplementedError

    def find_start(self, text: str, at_boundary: bool) -> tuple[int, int] | None:
        """(position, marker length) of the first call start in ``text``, or None.

        ``at_boundary``: nothing but blanks was written since the answer began or since the
        last tool call (where a syntax without a marker, such as a bare JSON object, may start).
        """
        found = [(text.find(m), len(m)) for m in self.start_markers if m in text]
        return min(found) if found else None

    def held_back(self, text: str, at_boundary: bool) -> int:
        """How many characters at the end of ``text`` might still begin a call."""
        return partial_suffix(text, self.start_markers)

    def find_end(self, body: str) -> int | None:
        """Length of the body that belongs to the call(s), end marker included; None if open."""
        raise NotImplementedError

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        """The calls in a body (possibly without its end, at the end of the answer), or None."""
        raise NotImplementedError

    def new_id(self) -> str:
        """A fresh tool-call id, for a call whose text carries none."""
        return "call_" + secrets.token_hex(12)


class HermesSyntax(ToolCallSyntax):
    """``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, one call per block."""

    name = "hermes"
    start_markers = ("<tool_call>",)
    end_marker = "</tool_call>"

    # the tag, then (through Jinja quoting) a JSON object with "name": Qwen3-Coder, GLM and
    # MiniMax write XML inside <tool_call> instead
    _SHAPE = re.compile(r'<tool_call>(?:\\n|[\s"\'{}%+~-])*\{\\?"name\\?"')

    def matches(self, template_source: str) -> bool:
        return self._SHAPE.search(template_source) is not None

    def find_end(self, body: str) -> int | None:
        pos = body.find(self.end_marker)
        return None if pos < 0 else pos + len(self.end_marker)

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        try:
            obj = json.loads(body.removesuffix(self.end_marker))
        except ValueError:
            return None
        call = _call_from_object(obj, ("arguments", "parameters"))
        return None if call is None else [call]


class Llama3JsonSyntax(ToolCallSyntax):
    """A bare ``{"name": ..., "parameters": ...}`` answer, or one after ``<|python_tag|>``."""

    name = "llama3-json"
    start_markers = ("<|python_tag|>",)

    def matches(self, template_source: str) -> bool:
        return "<|start_header_id|>" in template_source and '"parameters"' in template_source

    def find_start(self, text: str, at_boundary: bool) -> tuple[int, int] | None:
        tagged = super().find_start(text, at_boundary)
        stripped = text.lstrip()
        if at_boundary and stripped.startswith("{"):
            bare = (len(text) - len(stripped), 0)  # the brace belongs to the body
            return min(bare, tagged) if tagged else bare
        return tagged

    def find_end(self, body: str) -> int | None:
        end = json_value_end(body)
        if end is None:
            return None
        return len(body) if end < 0 else end  # -1: not JSON, give it back as text at once

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        call = _call_from_object(obj, ("parameters", "arguments"))
        # a bare JSON answer is a call only when it names a tool the request offered
        if call is None or call[0] not in tool_names:
            return None
        return [call]


class MistralSyntax(ToolCallSyntax):
    """``[TOOL_CALLS][{"name": ..., "arguments": ..., "id": ...}]`` or ``name[ARGS]{...}``."""

    name = "mistral"
    start_markers = ("[TOOL_CALLS]",)
    _ID_ALPHABET = string.ascii_letters + string.digits

    def matches(self, template_source: str) -> bool:
        return "[TOOL_CALLS]" in template_source

    def find_end(self, body: str) -> int | None:
        end = json_value_end(body)
        if end is not None and end >= 0:
            return end
        args = body.find("[ARGS]")
        if end is None or args < 0:
            return None
        end = json_value_end(body, args + len("[ARGS]"))
        if end is None:
            return None
        return len(body) if end < 0 else end

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        if "[ARGS]" in body and not body.lstrip().startswith(("[", "{")):
            head, _, arguments = body.partition("[ARGS]")
            name, _, call_id = head.partition("[CALL_ID]")
            try:
                obj = json.loads(arguments)
            except ValueError:
                return None
            record = {"name": name.strip(), "arguments": obj, "id": call_id.strip() or None}
            call = _call_from_object(record, ("arguments",))
            return None if call is None else [call]
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        calls = [
            _call_from_object(item, ("arguments",))
            for item in (obj if isinstance(obj, list) else [obj])
        ]
        return None if not calls or None in calls else calls  # type: ignore[return-value]

    def new_id(self) -> str:
        # Mistral's templates refuse any id but nine letters and digits when it is sent back
        return "".join(secrets.choice(self._ID_ALPHABET) for _ in range(9))


BUILTIN_SYNTAXES: tuple[ToolCallSyntax, ...] = (HermesSyntax(), Llama3JsonSyntax(), MistralSyntax())


@attrs.frozen
class ChatFormat:
    """What a model's answers contain besides plain text: reasoning markers and tool calls."""

    name: str
    reasoning: ReasoningMarkers | None = None
    tool_syntax: ToolCallSyntax | None = None


def detect_chat_format(
    template_source: str, syntaxes: Sequence[ToolCallSyntax] = BUILTIN_SYNTAXES
) -> ChatFormat:
    """The format of a chat template; the first syntax in ``syntaxes`` that matches wins."""
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

"""Tool-call syntaxes: the base class a template family implements, and its helpers.

A :class:`ToolCallSyntax` tells the chat parser (:mod:`tessera.plugins.chat.parser`) where a call
starts in the answer, where it ends, and which calls the text between holds. The built-in
families are in :mod:`tessera.plugins.chat.tool_call_families`; docs/chat.md shows how to add one.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from tessera.text.stop_strings import partial_suffix

ParsedCall = tuple[str, str, "str | None"]


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


def openai_call_id() -> str:
    """A tool-call id in OpenAI's shape (``call_`` and 24 hex digits)."""
    return "call_" + secrets.token_hex(12)


def call_from_object(obj: Any, argument_keys: Sequence[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    value = next((obj[key] for key in argument_keys if key in obj), None)
    arguments = arguments_json(value)
    if arguments is None:
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return obj["name"], arguments, call_id


class ToolCallSyntax(ABC):
    """How one template family writes tool calls; subclass it to add a family.

    The session finds a call's start in the content with :meth:`find_start`, collects the text
    after the start marker (the *body*) until :meth:`find_end` says where the call ends, then
    asks :meth:`parse` for the calls in it. A body that does not parse is given back as text.
    """

    name: ClassVar[str] = ""
    start_markers: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def matches(self, template_source: str) -> bool:
        """Whether a chat template (its Jinja source) writes tool calls this way."""

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

    @abstractmethod
    def find_end(self, body: str) -> int | None:
        """Length of the body that belongs to the call(s), end marker included; None if open.

        Decide from text already in ``body`` only, so that any split of the stream gives the
        same answer; after an empty start marker the length must be above 0.
        """

    @abstractmethod
    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        """The calls in a body (possibly without its end, at the end of the answer), or None."""

    def new_id(self) -> str:
        """A fresh tool-call id, for a call whose text carries none."""
        return openai_call_id()

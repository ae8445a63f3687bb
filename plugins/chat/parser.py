"""The streaming half of the chat layer: split generated text into parts as it arrives.

:class:`AnswerParser` is a small state machine (content, reasoning, tool call) over the text
fed so far. It holds back only what may still turn into a marker (a partial ``<tool_c``) or
blanks that a following marker would drop, so each piece yields the deltas safe to send now,
and every decision depends on text already seen: any split of the same text into pieces gives
the same parts. :class:`tessera.plugins.chat.session.ChatSession` wraps it with the prompt.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import Any

import attrs

from tessera.plugins.chat.format import ReasoningMarkers
from tessera.plugins.chat.tool_calls import ToolCallSyntax, partial_suffix

#: One OpenAI streaming delta (``choices[].delta``), ready for json.dumps.
Delta = dict[str, Any]


@attrs.frozen
class TextPart:
    """Answer text for the user (OpenAI ``content``)."""

    text: str


@attrs.frozen
class ReasoningPart:
    """The model's reasoning, markers removed (``reasoning_content``)."""

    text: str


@attrs.frozen
class ToolCallPart:
    """One function call (an entry of ``tool_calls``)."""

    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's ``function.arguments``

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


Part = TextPart | ReasoningPart | ToolCallPart


class PartStream(ABC):
    """What every answer parser shares: text fed piece by piece to a state machine
    (:meth:`_step` until it makes no more progress), and the parts and OpenAI deltas it
    records, a run of one kind of text making one part."""

    def __init__(self) -> None:
        self._buffer = ""
        self._parts: list[list] = []  # [kind, text or ToolCallPart]
        self._n_calls = 0

    def feed(self, text: str) -> list[Delta]:
        """Take the next piece of generated text; return the deltas now safe to send."""
        self._buffer += text
        deltas: list[Delta] = []
        while self._step(deltas, final=False):
            pass
        return deltas

    def finish(self) -> tuple[list[Part], list[Delta]]:
        """End of the text: the parts, and the deltas of what was still held back."""
        deltas: list[Delta] = []
        while self._step(deltas, final=True):
            pass
        parts = [p[1] if p[0] == "tool" else _PART_TYPES[p[0]](p[1]) for p in self._parts]
        return parts, deltas

    @abstractmethod
    def _step(self, deltas: list[Delta], final: bool) -> bool:
        """One state-machine step; True while it made progress and may make more."""

    def _record_text(self, kind: str, text: str, deltas: list[Delta]) -> None:
        """``text`` of ``kind`` (content, reasoning) onto the last part and delta of its kind."""
        if self._parts and self._parts[-1][0] == kind:
            self._parts[-1][1] += text
        else:
            self._parts.append([kind, text])
        key = "content" if kind == "content" else "reasoning_content"
        if deltas and key in deltas[-1]:
            deltas[-1][key] += text
        else:
            deltas.append({key: text})

    def _record_call(self, part: ToolCallPart, deltas: list[Delta]) -> None:
        """A whole tool call: its own part and its own delta."""
        self._parts.append(["tool", part])
        deltas.append({"tool_calls": [{"index": self._n_calls, **part.to_openai()}]})
        self._n_calls += 1


class AnswerParser(PartStream):
    """Feeds generated text; returns OpenAI deltas now and the parts at the end."""

    def __init__(
        self,
        reasoning: ReasoningMarkers | None,
        tool_syntax: ToolCallSyntax | None,
        tool_names: Collection[str],
        new_id: Callable[[], str],
        reasoning_open: bool = False,
    ) -> None:
        super().__init__()
        self.reasoning = reasoning
        self.tool_syntax = tool_syntax
        self.tool_names = tool_names
        self._new_id = new_id
        self._state = "reasoning" if reasoning is not None and reasoning_open else "content"
        self._marker = ""  # the start marker of the tool call being collected
        self._blanks = ""  # the blanks before it
        self._strip_leading = self._state == "reasoning"
        self._at_boundary = True

    def _step(self, deltas: list[Delta], final: bool) -> bool:
        if self._state == "reasoning":
            return self._step_reasoning(deltas, final)
        if self._state == "tool":
            return self._step_tool(deltas, final)
        return self._step_content(deltas, final)

    def _step_content(self, deltas: list[Delta], final: bool) -> bool:
        buf = self._buffer
        starts = []
        if self.reasoning is not None and self.reasoning.start in buf:
            starts.append((buf.find(self.reasoning.start), len(self.reasoning.start), "reasoning"))
        if self.tool_syntax is not None:
            found = self.tool_syntax.find_start(buf, self._at_boundary)
            if found is not None:
                starts.append((*found, "tool"))
        if starts:
            pos, length, state = min(starts)
            before = buf[:pos].rstrip()
            self._emit("content", before, deltas)
            self._blanks = buf[len(before) : pos]  # given back if the call does not parse
            self._marker = buf[pos : pos + length]
            self._buffer = buf[pos + length :]
            self._state = state
            if state == "reasoning":
                self._strip_leading = True
            return True
        if final:
            self._emit("content", buf, deltas)
            self._buffer = ""
            return False
        hold = 0
        if self.reasoning is not None:
            hold = partial_suffix(buf, (self.reasoning.start,))
        if self.tool_syntax is not None:
            hold = max(hold, self.tool_syntax.held_back(buf, self._at_boundary))
        # blanks wait too: they are dropped if a marker follows them
        safe = len(buf[: len(buf) - hold].rstrip())
        self._emit("content", buf[:safe], deltas)
        self._buffer = buf[safe:]
        return False

    def _step_reasoning(self, deltas: list[Delta], final: bool) -> bool:
        buf, end = self._buffer, self.reasoning.end  # type: ignore[union-attr]
        pos = buf.find(end)
        if pos >= 0:
            self._emit("reasoning", buf[:pos].rstrip(), deltas)
            self._buffer = buf[pos + len(end) :]
            self._state = "content"
            self._strip_leading = True
            return True
        if final:
            self._emit("reasoning", buf.rstrip(), deltas)
            self._buffer = ""
            return False
        safe = len(buf[: len(buf) - partial_suffix(buf, (end,))].rstrip())
        self._emit("reasoning", buf[:safe], deltas)
        self._buffer = buf[safe:]
        return False

    def _step_tool(self, deltas: list[Delta], final: bool) -> bool:
        syntax, body = self.tool_syntax, self._buffer
        end = syntax.find_end(body)  # type: ignore[union-attr]
        if end is None and not final:
            return False
        if end is None:
            end = len(body)
        raw = body[:end]
        calls = syntax.parse(raw, self.tool_names)  # type: ignore[union-attr]
        self._buffer = body[end:]
        self._state = "content"
        if calls is None:
            self._emit("content", self._blanks + self._marker + raw, deltas)
        else:
            for name, arguments, call_id in calls:
                part = ToolCallPart(id=call_id or self._new_id(), name=name, arguments=arguments)
                self._record_call(part, deltas)
            self._at_boundary = True
            self._strip_leading = True
        return bool(self._buffer) or final

    def _emit(self, kind: str, text: str, deltas: list[Delta]) -> None:
        if self._strip_leading:
            text = text.lstrip()
        if not text:
            return
        self._strip_leading = False
        if kind == "content":
            self._at_boundary = False
        self._record_text(kind, text, deltas)


_PART_TYPES: dict[str, type] = {"content": TextPart, "reasoning": ReasoningPart}

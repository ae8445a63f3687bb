"""The harmony format of gpt-oss: the answer is a sequence of messages, each a header and a
body, split into parts as it streams.

A message is ``<|start|>assistant`` (the prompt already ends with the first one), a header
naming its channel and maybe its recipient, ``<|message|>``, the body, and ``<|end|>``
(``<|call|>`` after a tool call, ``<|return|>`` after the last message; both end generation,
so the text usually stops before them)::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
    <|message|>{"city": "Paris"}

(one line in the text, broken here).

- ``analysis`` -> reasoning; ``final`` and ``commentary`` without a recipient (a preamble)
  -> content;
- a recipient ``functions.NAME`` (in the channel header or before it, in the role header)
  with a JSON body -> a tool call, when NAME is one of the request's tools; otherwise the
  message is kept as text, header and markers and all, as the model wrote it;
- another recipient (a built-in tool: ``browser.search``, ``python``) -> reasoning, since
  it is the model's own work, not the answer;
- text that is not harmony at all -> content, up to the next header.

Consecutive messages of one kind make one part, a newline apart. As in
:class:`tessera.plugins.chat.parser.AnswerParser`: only what may still become a
marker (and blanks a marker would drop) waits; a tool call is sent whole when its message
ends; any split of the same text gives the same parts. With reasoning off (``reasoning_format
none``) analysis messages stay in the content, header and markers and all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection

from tessera.plugins.chat.parser import Delta, PartStream, ToolCallPart
from tessera.plugins.chat.tool_calls import arguments_json, partial_suffix

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
#: The markers that end a message's body (consumed with it).
ENDS = ("<|end|>", "<|call|>", "<|return|>")
#: How a header may begin: a role, a channel, or the recipient right after the prompt's role.
HEADER_STARTS = ("<|", "to=")
#: A header longer than this without ``<|message|>`` is not a header.
MAX_HEADER = 256
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z0-9_]+)")
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")


def harmony_messages(messages: list[dict]) -> list[dict]:
    """OpenAI messages as the gpt-oss template reads them: an assistant's
    ``reasoning_content`` becomes its ``thinking`` (with tool calls, in place of the content,
    which the template would also render as analysis), as llama.cpp passes them."""
    out = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("reasoning_content"), str):
            message = dict(message, thinking=message["reasoning_content"])
            if message.get("tool_calls"):
                message.pop("content", None)
        out.append(message)
    return out


class HarmonyParser(PartStream):
    """Feeds generated harmony text; returns OpenAI deltas now and the parts at the end."""

    def __init__(
        self, reasoning: bool, tool_names: Collection[str], new_id: Callable[[], str]
    ) -> None:
        super().__init__()
        self.reasoning, self.tool_names, self._new_id = reasoning, tool_names, new_id
        self._state = "header"  # header, body (kind: reasoning, content, tool, raw) or text
        self._kind = ""
        self._header = ""
        self._tool = ""
        self._text_from = 0  # where plain text may meet the next header
        self._strip_leading = True
        #: The next text opens a message that continues a part of its kind: a newline first.
        self._join = False
        self._joinable = False  # the last text was a message's own (not kept as written)

    def _step(self, deltas: list[Delta], final: bool) -> bool:
        if self._state == "header":
            return self._step_header(deltas, final)
        if self._state == "text":
            return self._step_text(deltas, final)
        return self._step_body(deltas, final)

    def _step_header(self, deltas: list[Delta], final: bool) -> bool:
        buf = self._buffer
        head = buf.lstrip()
        if not head:
            self._buffer = "" if final else buf
            return False
        pos = buf.find(MESSAGE)
        starts = any(head.startswith(s) or s.startswith(head) for s in HEADER_STARTS)
        if not starts or pos > MAX_HEADER or (pos < 0 and len(buf) > MAX_HEADER):
            self._state = "text"  # not harmony: plain content up to the next header
            # the marker that opened the header that was none is text too
            self._text_from = len(buf) - len(head) + 1 if starts else 0
            return True
        if pos < 0:
            if final and re.fullmatch(r"\s*(<\|start\|>\s*assistant\s*)?", buf) is None:
                self._emit("content", buf, deltas, strip=False)  # a cut-off header, as written
            if final:
                self._buffer = ""
            return False
        self._header, self._buffer = buf[: pos + len(MESSAGE)], buf[pos + len(MESSAGE) :]
        self._kind = self._kind_of(self._header)
        self._state, self._strip_leading, self._join = "body", True, self._joinable
        if self._kind == "raw" and not self._tool:  # reasoning kept as text, markers too
            self._emit("content", self._header, deltas, strip=False)
        return True

    def _kind_of(self, header: str) -> str:
        # the last channel counts: gpt-oss-20b sometimes writes a stray commentary one first
        channels = _CHANNEL.findall(header)
        recipient = _RECIPIENT.search(header.removeprefix(START))
        to = recipient[1] if recipient else "assistant"
        self._tool = ""
        if to.startswith("functions."):
            self._tool = to.removeprefix("functions.")
            return "tool" if self._tool in self.tool_names else "raw"
        if to != "assistant" or channels[-1:] == ["analysis"]:
            return "reasoning" if self.reasoning else "raw"
        return "content"

    def _step_body(self, deltas: list[Delta], final: bool) -> bool:
        buf, kind = self._buffer, self._kind
        found = [(buf.find(m), m) for m in (*ENDS, START) if m in buf]
        if found:
            pos, marker = min(found)
            end = pos + (len(marker) if marker in ENDS else 0)  # a new <|start|> stays
            self._close(buf[:pos], buf[pos:end], deltas)
            self._buffer, self._state = buf[end:], "header"
            return True
        if final:
            self._close(buf, "", deltas)
            self._buffer = ""
            return False
        if kind in ("tool", "raw") and self._tool:
            return False  # a call is sent whole
        hold = partial_suffix(buf, (*ENDS, START))
        safe = len(buf) - hold if kind == "raw" else len(buf[: len(buf) - hold].rstrip())
        self._emit(_KIND_PART[kind], buf[:safe], deltas, strip=kind != "raw")
        self._buffer = buf[safe:]
        return False

    def _close(self, body: str, end: str, deltas: list[Delta]) -> None:
        """The end of a message: its last text, or its tool call."""
        kind = self._kind
        if self._tool:
            call = self._parse_call(body) if kind == "tool" else None
            if call is None:
                self._emit("content", self._header + body + end, deltas, strip=False)
                return
            self._record_call(call, deltas)
        elif kind == "raw":
            self._emit("content", body + end, deltas, strip=False)
        else:
            text = body if end == "" and kind == "content" else body.rstrip()
            self._emit(_KIND_PART[kind], text, deltas)

    def _parse_call(self, body: str) -> ToolCallPart | None:
        try:
            arguments = arguments_json(json.loads(body))
        except ValueError:
            return None
        if arguments is None:
            return None
        return ToolCallPart(id=self._new_id(), name=self._tool, arguments=arguments)

    def _step_text(self, deltas: list[Delta], final: bool) -> bool:
        buf = self._buffer
        found = [p for p in (buf.find(m, self._text_from) for m in (START, CHANNEL)) if p >= 0]
        if found:
            pos = min(found)
            self._emit("content", buf[:pos], deltas, strip=False)
            self._buffer, self._state, self._text_from = buf[pos:], "header", 0
            return True
        safe = len(buf) if final else len(buf) - partial_suffix(buf, (START, CHANNEL))
        safe = max(safe, min(self._text_from, len(buf)))  # the false header's marker is text
        self._emit("content", buf[:safe], deltas, strip=False)
        self._buffer = buf[safe:]
        if safe:
            self._text_from = 0
        return False

    def _emit(self, kind: str, text: str, deltas: list[Delta], strip: bool = True) -> None:
        if strip and self._strip_leading:
            text = text.lstrip()
        if not text:
            return
        joins = self._parts and self._parts[-1][0] == kind
        if strip and self._join and joins:
            text = "\n" + text  # two messages of one kind: one part, a line apart
        self._strip_leading = self._join = False
        self._joinable = strip
        self._record_text(kind, text, deltas)


_KIND_PART = {"reasoning": "reasoning", "content": "content", "raw": "content", "tool": "content"}

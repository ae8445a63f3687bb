"""The tool-call syntaxes tessera knows: Hermes/Qwen, Llama 3.x JSON, Mistral, DeepSeek."""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Collection

from tessera.plugins.chat.tool_calls import (
    ParsedCall,
    ToolCallSyntax,
    call_from_object,
    json_value_end,
)


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
        call = call_from_object(obj, ("arguments", "parameters"))
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

    # a call names its function first; an answer that does not within this many characters is
    # text, so a long JSON answer streams instead of waiting for its closing brace
    HEAD_WINDOW = 64
    _HEAD = re.compile(r'\s*\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')

    def find_end(self, body: str) -> int | None:
        # every answer here depends only on a prefix of the body that is already there, so
        # the cut is the same however the text was split into pieces
        end = json_value_end(body)
        if end == -1:  # <|python_tag|> and no JSON: give back the tag (and blanks) as text
            return len(body) - len(body.lstrip())
        if end is not None and end <= self.HEAD_WINDOW:
            return end
        if len(body) >= self.HEAD_WINDOW and not self._HEAD.match(body[: self.HEAD_WINDOW]):
            return self.HEAD_WINDOW
        return end

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        call = call_from_object(obj, ("parameters", "arguments"))
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
        start = args + len("[ARGS]")
        end = json_value_end(body, start)
        if end == -1:  # no JSON after [ARGS]: give back what came so far as text
            return start
        return end

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        if "[ARGS]" in body and not body.lstrip().startswith(("[", "{")):
            head, _, arguments = body.partition("[ARGS]")
            name, _, call_id = head.partition("[CALL_ID]")
            try:
                obj = json.loads(arguments)
            except ValueError:
                return None
            record = {"name": name.strip(), "arguments": obj, "id": call_id.strip() or None}
            call = call_from_object(record, ("arguments",))
            return None if call is None else [call]
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        calls = [
            call_from_object(item, ("arguments",))
            for item in (obj if isinstance(obj, list) else [obj])
        ]
        return None if not calls or None in calls else calls  # type: ignore[return-value]

    def new_id(self) -> str:
        # Mistral's templates refuse any id but nine letters and digits when it is sent back
        return "".join(secrets.choice(self._ID_ALPHABET) for _ in range(9))


class DeepSeekSyntax(ToolCallSyntax):
    """DeepSeek's ``<｜tool▁calls▁begin｜>`` block of ``<｜tool▁call▁begin｜>...`` calls.

    R1 writes ``function<｜tool▁sep｜>name`` and the arguments in a fenced ```json block;
    V3.1 writes ``name<｜tool▁sep｜>{...}``.
    """

    name = "deepseek"
    start_markers = ("<｜tool▁calls▁begin｜>",)
    end_marker = "<｜tool▁calls▁end｜>"
    _CALL_BEGIN, _CALL_END, _SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
    _FENCED = re.compile(r"\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

    def matches(self, template_source: str) -> bool:
        return self.start_markers[0] in template_source

    def find_end(self, body: str) -> int | None:
        pos = body.find(self.end_marker)
        return None if pos < 0 else pos + len(self.end_marker)

    def parse(self, body: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
        chunks = body.removesuffix(self.end_marker).split(self._CALL_BEGIN)
        if chunks[0].strip():
            return None
        calls = [self._parse_call(chunk.strip()) for chunk in chunks[1:]]
        return calls if calls and None not in calls else None  # type: ignore[return-value]

    def _parse_call(self, chunk: str) -> ParsedCall | None:
        head, sep, rest = chunk.removesuffix(self._CALL_END).partition(self._SEP)
        if not sep or not chunk.endswith(self._CALL_END):
            return None
        if rest.lstrip().startswith("{"):  # V3.1: name<sep>{...}
            name, arguments = head.strip(), rest
        else:  # R1: function<sep>name\n```json\n{...}\n```
            name, _, fenced = rest.partition("\n")
            match = self._FENCED.match(fenced)
            if match is None:
                return None
            name, arguments = name.strip(), match.group(1)
        try:
            obj = json.loads(arguments)
        except ValueError:
            return None
        return call_from_object({"name": name, "arguments": obj}, ("arguments",))

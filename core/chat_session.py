"""One chat completion: render the prompt, then split the model's text into parts as it streams.

The assistant's answer is a list of parts, not one string (as llama.cpp 0.7.0 has it):
:class:`TextPart`, :class:`ReasoningPart` and :class:`ToolCallPart`. The server uses it so::

    session = ChatSession(template, fmt, messages, tools=tools, tool_choice=tool_choice)
    prompt = session.prompt()                  # add_generation_prompt=True, tools rendered
    for piece in detokenized_pieces:           # after the stop-string filter (stop_strings.py)
        for delta in session.feed(piece):      # OpenAI ``choices[].delta`` dicts
            send(delta)
    result = session.finish()                  # the rest of the deltas in result.deltas
    message = result.message()                 # role, content, reasoning_content, tool_calls

A delta is a plain dict: ``{"content": str}``, ``{"reasoning_content": str}`` or
``{"tool_calls": [{"index", "id", "type": "function", "function": {"name", "arguments"}}]}``.
Text that may be the start of a marker (``<thi``, ``<tool_c``) is held back until it is known;
a tool call is sent whole, in one delta, once its end is seen. Concatenating the deltas of any
split of the same text gives exactly ``finish()``'s parts. Reasoning is trimmed of blanks at
both ends, content of blanks next to a marker; a tool call whose JSON does not parse is kept,
blanks and markers and all, as text.

``fmt`` (:func:`tessera.chat_format.detect_chat_format`) says which markers to look for.
Reasoning that the prompt already opened (Qwen3/DeepSeek-R1 templates that end with
``<think>\\n``) is found from the rendered prompt.

Models without a chat template: ``tessera.chat.template_for`` falls back to ChatML, as llama.cpp
does, which suits ``tessera run``; chat endpoints should instead call :func:`chat_template` and so
refuse a model with no template of its own unless the user passed ``--chat-template``
(:class:`NoChatTemplateError`), since a guessed format gives confidently wrong answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from tessera.chat import ChatTemplate
from tessera.chat_format import ChatFormat, ReasoningMarkers, detect_chat_format, partial_suffix
from tessera.errors import TesseraError

Delta = dict[str, Any]
REASONING_FORMATS = ("auto", "deepseek", "none")


class NoChatTemplateError(TesseraError):
    """A chat endpoint was asked of a model that ships no chat template."""


class ChatRequestError(TesseraError):
    """A chat request's options are invalid (tool_choice, reasoning_format, tools)."""


@attrs.frozen
class TextPart:
    text: str


@attrs.frozen
class ReasoningPart:
    text: str


@attrs.frozen
class ToolCallPart:
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


@attrs.frozen
class ChatResult:
    """The parsed answer; ``deltas`` are the streaming deltas ``finish()`` still had to send."""

    parts: list[Part]
    deltas: list[Delta] = attrs.field(factory=list)

    @property
    def content(self) -> str | None:
        """The text parts joined; None when the answer is only tool calls (as OpenAI sends it)."""
        texts = [p.text for p in self.parts if isinstance(p, TextPart)]
        if not texts and self.tool_calls:
            return None
        return "".join(texts)

    @property
    def reasoning_content(self) -> str | None:
        texts = [p.text for p in self.parts if isinstance(p, ReasoningPart)]
        return "".join(texts) if texts else None

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        calls = [p.to_openai() for p in self.parts if isinstance(p, ToolCallPart)]
        return calls or None

    @property
    def finish_reason(self) -> str | None:
        """``"tool_calls"`` when the answer called a tool; otherwise the server's stop/length."""
        return "tool_calls" if self.tool_calls else None

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message (``choices[].message``)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def has_own_chat_template(metadata: Mapping[str, Any]) -> bool:
    """Whether the model file carries a chat template (GGUF ``tokenizer.chat_template``)."""
    return bool(metadata.get("tokenizer.chat_template"))


def chat_template(
    metadata: Mapping[str, Any],
    override: str | None = None,
    bos_token: str = "",
    eos_token: str = "",
) -> ChatTemplate:
    """The template for chat endpoints: ``override`` (--chat-template), else the model's own."""
    source = override or metadata.get("tokenizer.chat_template")
    if not source:
        raise NoChatTemplateError(
            "this model has no chat template; use /v1/completions with your own prompt format "
            "or start the server with --chat-template"
        )
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)


def _history_for_template(messages: list[dict]) -> list[dict]:
    # OpenAI sends tool-call arguments as JSON text; templates expect the object (Qwen2.5 and
    # Mistral apply tojson to it), so hand them the parsed object when it is one
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            message = dict(message, tool_calls=[_object_arguments(c) for c in calls])
        out.append(message)
    return out


def _object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    if not isinstance(arguments, dict):
        return call
    return dict(call, function=dict(function, arguments=arguments))


def _check_tool_choice(tool_choice: Any) -> None:
    if tool_choice is None or tool_choice in ("auto", "none", "required"):
        return
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        return
    raise ChatRequestError(
        f"tool_choice {tool_choice!r} is not understood; use 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}'
    )


class ChatSession:
    """Renders one chat request's prompt and parses the answer as it streams."""

    def __init__(
        self,
        template: ChatTemplate,
        fmt: ChatFormat | None,
        messages: list[dict],
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        reasoning_format: Literal["auto", "deepseek", "none"] = "auto",
        template_kwargs: Mapping[str, Any] | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        if reasoning_format not in REASONING_FORMATS:
            raise ChatRequestError(
                f"reasoning_format {reasoning_format!r} is not supported; use one of "
                + ", ".join(REASONING_FORMATS)
            )
        _check_tool_choice(tool_choice)
        self.format = fmt if fmt is not None else detect_chat_format(template.source)
        # tool_choice "none": the model is not told about the tools, and nothing is parsed
        offered = tools if tools and tool_choice != "none" else None
        self.tool_syntax = self.format.tool_syntax if offered else None
        self.tool_names = frozenset(t.get("function", {}).get("name") for t in offered or ())
        self.reasoning: ReasoningMarkers | None = (
            self.format.reasoning if reasoning_format != "none" else None
        )
        self._prompt = template.render(
            _history_for_template(messages), tools=offered, **dict(template_kwargs or {})
        )
        self._new_id = id_factory or (self.tool_syntax.new_id if self.tool_syntax else None)
        self._state = "content"
        if self.reasoning is not None and self._prompt.rstrip().endswith(self.reasoning.start):
            self._state = "reasoning"
        self._buffer = ""
        self._marker = ""  # the start marker of the tool call being collected
        self._blanks = ""  # the blanks before it
        self._strip_leading = self._state == "reasoning"
        self._at_boundary = True
        self._parts: list[list] = []  # [kind, text or ToolCallPart]
        self._n_calls = 0
        self._finished = False

    def prompt(self) -> str:
        """The rendered prompt, ending with the template's cue for the assistant."""
        return self._prompt

    def feed(self, text: str) -> list[Delta]:
        """Take the next piece of generated text; return the deltas now safe to send."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += text
        deltas: list[Delta] = []
        while self._step(deltas, final=False):
            pass
        return deltas

    def finish(self) -> ChatResult:
        """End of generation: flush what was held back and return the parsed answer."""
        deltas: list[Delta] = []
        if not self._finished:
            self._finished = True
            while self._step(deltas, final=True):
                pass
        parts = [p[1] if p[0] == "tool" else _PART_TYPES[p[0]](p[1]) for p in self._parts]
        return ChatResult(parts=parts, deltas=deltas)

    # one state-machine step; True while it made progress and may make more
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
            self._strip_leading = state == "reasoning"
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
                self._parts.append(["tool", part])
                deltas.append({"tool_calls": [{"index": self._n_calls, **part.to_openai()}]})
                self._n_calls += 1
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
        if self._parts and self._parts[-1][0] == kind:
            self._parts[-1][1] += text
        else:
            self._parts.append([kind, text])
        key = "content" if kind == "content" else "reasoning_content"
        if deltas and key in deltas[-1]:
            deltas[-1][key] += text
        else:
            deltas.append({key: text})


_PART_TYPES: dict[str, type] = {"content": TextPart, "reasoning": ReasoningPart}

"""One chat completion: render the prompt, then split the model's text into parts as it streams.

The assistant's answer is a list of parts, not one string (as llama.cpp 0.7.0 has it):
:class:`TextPart`, :class:`ReasoningPart` and :class:`ToolCallPart`. The server uses it so::

    session = ChatSession(template, fmt, messages, tools=tools, tool_choice=tool_choice)
    prompt = session.prompt()                  # add_generation_prompt=True, tools rendered
    for piece in detokenized_pieces:           # after the stop strings (tessera.text.stop_strings)
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

``fmt`` (:func:`tessera.plugins.chat.format.detect_chat_format`) says which markers to look for.
Reasoning that the prompt already opened (Qwen3/DeepSeek-R1 templates that end with
``<think>\\n``) is found from the rendered prompt.

Models without a chat template: ``tessera.text.chat_template.template_for`` falls back to ChatML, as
llama.cpp does, which suits ``tessera run``; chat endpoints should instead call
:func:`chat_template` and so refuse a model with no template of its own unless the user passed
``--chat-template`` (:class:`NoChatTemplateError`), since a guessed format gives confidently wrong
answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from tessera.errors import TesseraError
from tessera.plugins.chat.format import ChatFormat, ReasoningMarkers, detect_chat_format
from tessera.plugins.chat.harmony import HarmonyParser, harmony_messages
from tessera.plugins.chat.parser import (
    AnswerParser,
    Delta,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
)
from tessera.plugins.chat.tool_calls import openai_call_id
from tessera.text.chat_template import ChatTemplate, ChatTemplateError

__all__ = [
    "ChatRequestError",
    "ChatResult",
    "ChatSession",
    "Delta",
    "NoChatTemplateError",
    "Part",
    "ReasoningPart",
    "TextPart",
    "ToolCallPart",
    "chat_template",
    "has_own_chat_template",
]
REASONING_FORMATS = ("auto", "deepseek", "none")


class NoChatTemplateError(TesseraError):
    """A chat endpoint was asked of a model that ships no chat template."""


class ChatRequestError(TesseraError):
    """A chat request's options are invalid (tool_choice, reasoning_format, tools)."""


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


def _render(
    template: ChatTemplate, messages: list[dict], tools: list[dict] | None, extra: dict
) -> str:
    # OpenAI sends tool-call arguments as JSON text; most templates expect the object (Qwen2.5
    # and Mistral apply tojson to it), a few join it to strings (DeepSeek-R1-Distill-Llama):
    # try the object first and fall back to the text as sent
    with_objects = _with_object_arguments(messages)
    if with_objects == messages:
        return template.render(messages, tools=tools, **extra)
    try:
        return template.render(with_objects, tools=tools, **extra)
    except ChatTemplateError:
        return template.render(messages, tools=tools, **extra)


def _with_object_arguments(messages: list[dict]) -> list[dict]:
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


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    for tool in tools if isinstance(tools, list) else [None]:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatRequestError(
                f"tools entry {tool!r} is not a function tool; give each as "
                '{"type": "function", "function": {"name": ..., "parameters": {...}}}'
            )


class ChatSession:
    """Renders one chat request's prompt and parses the answer as it streams.

    ``tool_choice``: ``"none"`` keeps the tools out of the prompt and parses no calls;
    ``"required"`` and a named function are accepted but not enforced (no grammar yet), the
    model is only offered the tools. ``reasoning_format``: ``"auto"``/``"deepseek"`` move
    reasoning into ``reasoning_content``, ``"none"`` leaves it in the content, tags and all.
    ``template_kwargs`` become template variables (``enable_thinking``, llama.cpp's
    ``chat_template_kwargs``). ``id_factory`` makes tool-call ids (tests make them predictable).
    """

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
        _check_tools(tools)
        self.format = fmt if fmt is not None else detect_chat_format(template.source)
        # tool_choice "none": the model is not told about the tools, and nothing is parsed
        offered = tools if tools and tool_choice != "none" else None
        self.tool_syntax = self.format.tool_syntax if offered else None
        self.tool_names = frozenset(t["function"]["name"] for t in offered or ())
        self.reasoning: ReasoningMarkers | None = (
            self.format.reasoning if reasoning_format != "none" else None
        )
        if self.format.harmony:
            messages = harmony_messages(messages)
        self._prompt = _render(template, messages, offered, dict(template_kwargs or {}))
        reasoning_open = self.reasoning is not None and self._prompt.rstrip().endswith(
            self.reasoning.start
        )
        new_id = id_factory or (self.tool_syntax.new_id if self.tool_syntax else openai_call_id)
        self._parser: AnswerParser | HarmonyParser
        if self.format.harmony:  # channels, not markers: reasoning unless "none"
            self._parser = HarmonyParser(reasoning_format != "none", self.tool_names, new_id)
        else:
            self._parser = AnswerParser(
                self.reasoning, self.tool_syntax, self.tool_names, new_id, reasoning_open
            )
        self._result: ChatResult | None = None

    def prompt(self) -> str:
        """The rendered prompt, ending with the template's cue for the assistant."""
        return self._prompt

    def feed(self, text: str) -> list[Delta]:
        """Take the next piece of generated text; return the deltas now safe to send."""
        if self._result is not None:
            raise RuntimeError("feed() after finish()")
        return self._parser.feed(text)

    def finish(self) -> ChatResult:
        """End of generation: flush what was held back and return the parsed answer."""
        if self._result is None:
            parts, deltas = self._parser.finish()
            self._result = ChatResult(parts=parts, deltas=deltas)
        return self._result

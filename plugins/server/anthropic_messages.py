"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

A Messages request is turned into the chat completion it means (system prompt first,
content blocks as text, tool_use and tool_result blocks as OpenAI's tool calls and tool
messages) and runs through ``/v1/chat/completions``' machinery: the chat plugin's
ChatSession (template, reasoning, tool calls), the slot engine, stop strings; tool_choice
``any`` and ``tool`` force a tool call by the tool-call constraint. The answer is
Anthropic's message of content blocks (``thinking``, ``text``, ``tool_use``); errors on
these routes have Anthropic's shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tessera.contract.routes import ApiError
from tessera.plugins.server.state import ServerState

from .anthropic_stream import events
from .api_fields import CHAT
from .api_fields_anthropic import ANTHROPIC_MESSAGES, ANTHROPIC_PROMPT
from .chat_completions import chat_session, prompt_tokens
from .constraint_request import forced_tool_call
from .content_parts import no_encoder
from .fields import Fields, read_json
from .generation import ChoiceRun, run_all, start_runs
from .openai_common import SSE_HEADERS, generation_requests, new_id, sampler_params

#: Anthropic's error type of each HTTP status
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(error: ApiError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``."""
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def anthropic_errors(
    handler: Callable[[Request], Awaitable[Any]],
) -> Callable[[Request], Awaitable[Any]]:
    """The handler with its ApiErrors answered in Anthropic's shape."""

    async def endpoint(request: Request) -> Any:
        try:
            return await handler(request)
        except ApiError as exc:
            return JSONResponse(error_body(exc), status_code=exc.status)

    return endpoint


def _bad(message: str, param: str = "messages") -> ApiError:
    return ApiError(400, message, param)


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined (the only blocks a system prompt takes)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content blocks", where)
    texts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _bad(f"{where} takes text blocks only", where)
        if not isinstance(block.get("text"), str):
            raise _bad(f"a text block in {where} needs a string 'text'", where)
        texts.append(block["text"])
    return "".join(texts)


def _turn(message: Any) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages (tool results become tool messages)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise _bad("each message must be an object with role 'user' or 'assistant'")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _bad("a message's content must be a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "image":
            raise no_encoder("vision")
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            continue  # earlier reasoning is not shown to the model again, as templates drop it
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            args = json.dumps(block.get("input") or {})
            call = {"name": block["name"], "arguments": args}
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": call})
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": _text(result, "tool_result content"),
                }
            )
        else:
            raise _bad(f"content block {str(kind)[:40]!r} is not supported in a {role} message")
    if texts or calls:
        turn: dict[str, Any] = {"role": role, "content": "".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        out.append(turn)
    return out


def _tools(tools: Any, choice: Any) -> dict[str, Any]:
    """Anthropic's tools and tool_choice as chat completion fields."""
    out: dict[str, Any] = {}
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict)
            and isinstance(t.get("name"), str)
            and isinstance(t.get("input_schema"), dict)
            and isinstance(t.get("description", ""), str)
            for t in tools
        ):
            raise _bad("'tools' must be a list of {name, description, input_schema}", "tools")
        out["tools"] = [
            {"type": "function", "function": {"name": t["name"],
             "description": t.get("description", ""), "parameters": t["input_schema"]}}
            for t in tools
        ]  # fmt: skip
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        name = choice.get("name") if isinstance(choice, dict) else None
        if kind not in ("auto", "any", "tool", "none") or (
            kind == "tool" and not isinstance(name, str)
        ):
            raise _bad("'tool_choice' must be {type: auto | any | none} or {type: tool, name}",
                       "tool_choice")  # fmt: skip
        out["tool_choice"] = (
            {"type": "function", "function": {"name": name}}
            if kind == "tool"
            else {"auto": "auto", "any": "required", "none": "none"}[kind]
        )
    return out


def _thinking(thinking: Any) -> dict[str, Any] | None:
    """Anthropic's ``thinking`` as the chat template's ``enable_thinking``."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled"):
        raise _bad("'thinking' must be {type: enabled, budget_tokens} or {type: disabled}",
                   "thinking")  # fmt: skip
    return {"enable_thinking": kind == "enabled"}


def chat_body(f: Fields) -> dict[str, Any]:
    """The chat completion body (messages, tools) of an Anthropic request."""
    messages: list[dict[str, Any]] = []
    if f["system"] is not None:
        messages.append({"role": "system", "content": _text(f["system"], "system")})
    turns = f["messages"]
    if not isinstance(turns, list) or not turns:
        raise _bad("'messages' must be a non-empty list of messages")
    for message in turns:
        messages.extend(_turn(message))
    body = {"model": f["model"], "messages": messages, **_tools(f["tools"], f["tool_choice"])}
    body["chat_template_kwargs"] = _thinking(f["thinking"])
    return body


def stop_reason(run: ChoiceRun, called: bool) -> str:
    """Anthropic's stop_reason of a finished run."""
    if called:
        return "tool_use"
    if run.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if run.stopping_word else "end_turn"


def content_blocks(result: Any) -> list[dict[str, Any]]:
    """A parsed answer as Anthropic's content blocks."""
    blocks: list[dict[str, Any]] = []
    if result.reasoning_content:
        blocks.append({"type": "thinking", "thinking": result.reasoning_content, "signature": ""})
    if result.content:
        blocks.append({"type": "text", "text": result.content})
    for call in result.tool_calls or ():
        fn = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"],
                       "input": json.loads(fn.get("arguments") or "{}")})  # fmt: skip
    return blocks


@anthropic_errors
async def anthropic_messages(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), ANTHROPIC_MESSAGES)
    body = chat_body(f)
    for name in ("temperature", "top_p", "top_k", "max_tokens"):
        if f.body.get(name) is not None:
            body[name] = f[name]
    body["stop"] = f["stop_sequences"]
    chat = Fields(body, CHAT)
    samplers = sampler_params(chat, 1, state.settings.sampler)
    served = await state.model_for(request, f["model"])
    session = chat_session(served, chat)
    prompt = prompt_tokens(served, session.prompt())
    # tool_choice any / tool force a call by constraint, as OpenAI's required / named do
    syntax = session.format.tool_syntax
    tool_call = forced_tool_call(
        chat["tools"], chat["tool_choice"], syntax.name if syntax else None
    )
    requests = await generation_requests(
        chat, served, prompt, samplers, f["max_tokens"], -1, tool_call=tool_call
    )
    (run,) = start_runs(served, requests, chat["stop"])
    head = {"id": new_id("msg"), "type": "message", "role": "assistant", "model": served.name}
    if f["stream"]:
        stream = events(head, len(prompt), run, session, stop_reason, error_body)
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)
    await run_all(request, [run])
    session.feed(run.text)
    result = session.finish()
    return JSONResponse(
        {
            **head,
            "content": content_blocks(result),
            "stop_reason": stop_reason(run, bool(result.tool_calls)),
            "stop_sequence": run.stopping_word or None,
            "usage": {"input_tokens": run.finish.n_prompt, "output_tokens": run.finish.n_generated},
        }
    )


@anthropic_errors
async def anthropic_count_tokens(request: Request) -> Any:
    """``{"input_tokens": N}``: the prompt tokens /v1/messages would evaluate."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), ANTHROPIC_PROMPT)
    chat = Fields(chat_body(f), CHAT)
    served = await state.model_for(request, f["model"])
    prompt = prompt_tokens(served, chat_session(served, chat).prompt())
    return JSONResponse({"input_tokens": len(prompt)})

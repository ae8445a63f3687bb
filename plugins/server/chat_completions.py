"""POST /v1/chat/completions: messages in, an assistant message of parts out.

The model's text goes through :class:`tessera.plugins.chat.session.ChatSession`, which splits it
into content, reasoning and tool calls (OpenAI's ``content``, ``reasoning_content`` and
``tool_calls``), in the stream as in the whole answer.
"""

from __future__ import annotations

from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tessera.contract.routes import ApiError
from tessera.engine.slot_types import GenerationRequest
from tessera.errors import TesseraError
from tessera.plugins.chat import ChatSession, chat_template
from tessera.plugins.server.state import ServedModel, ServerState

from .api_fields import CHAT
from .constraint_request import forced_tool_call
from .content_parts import plain_messages
from .fields import Fields, read_json
from .generation import (
    ChoiceRun,
    Piece,
    finish_timings,
    run_all,
    start_runs,
    timings,
    usage,
)
from .openai_common import (
    SSE_HEADERS,
    generation_requests,
    interleave,
    logprob_entry,
    max_tokens,
    response_head,
    sampler_params,
    sse,
)


def template_kwargs(f: Fields) -> dict[str, Any] | None:
    """The chat template's variables: ``chat_template_kwargs`` with ``reasoning_effort``
    over them, as llama-server does: ``none`` turns ``enable_thinking`` off (and passes no
    level), any other level becomes the template's ``reasoning_effort`` (gpt-oss's)."""
    effort, kwargs = f["reasoning_effort"], f["chat_template_kwargs"]
    if effort is None:
        return kwargs
    out = dict(kwargs or {})
    if effort == "none":
        out["enable_thinking"] = False
        out.pop("reasoning_effort", None)
    else:
        out["reasoning_effort"] = effort
    return out


def chat_session(served: ServedModel, f: Fields) -> ChatSession:
    """The chat of a request: its messages rendered with the template, tools and options."""
    messages = f["messages"]
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise ApiError(
            400, "'messages' must be a non-empty list of objects with a 'role'", "messages"
        )
    messages = plain_messages(messages)
    tok = served.tokenizer
    tools = f["tools"]
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "'tools' must be a list of tool objects", "tools")
    try:
        template = chat_template(
            served.model.metadata,
            served.chat_template,
            tok.token_to_piece(tok.bos_id) if tok.bos_id is not None else "",
            tok.token_to_piece(tok.eos_id) if tok.eos_id is not None else "",
        )
        return ChatSession(
            template,
            None,
            messages,
            tools=tools,
            tool_choice=f["tool_choice"],
            reasoning_format=f["reasoning_format"],
            template_kwargs=template_kwargs(f),
        )
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None


def prompt_tokens(served: ServedModel, text: str) -> list[int]:
    """Tokens of a rendered chat prompt; a BOS the template wrote is not added twice."""
    tok = served.tokenizer
    bos = tok.token_to_piece(tok.bos_id) if tok.bos_id is not None else ""
    add_special = not (bos and text.startswith(bos))
    return tok.encode(text, add_special=add_special, parse_special=True)


@attrs.frozen
class ChatRequest:
    """A chat completion's body read and checked, every field of it, before any work."""

    fields: Fields
    served: ServedModel
    #: One session per choice (``n``).
    sessions: list[ChatSession]
    #: The messages rendered by the chat template.
    prompt: str
    #: One per choice; nothing started.
    requests: list[GenerationRequest]


async def chat_request(request: Request) -> ChatRequest:
    """The :class:`ChatRequest` of ``request``. The prompt-only routes (/apply-template,
    .../input_tokens) use it too, so they refuse what the completion refuses."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), CHAT)
    n = f["n"]
    n_top = f["top_logprobs"] if f["logprobs"] else -1
    n_predict = max_tokens(f, default=state.settings.default_n_predict(-1))
    samplers = sampler_params(f, n, state.settings.sampler)
    served = await state.model_for(request, f["model"])
    sessions = [chat_session(served, f) for _ in range(n)]
    text = sessions[0].prompt()
    syntax = sessions[0].format.tool_syntax
    tool_call = forced_tool_call(f["tools"], f["tool_choice"], syntax.name if syntax else None)
    prompt = prompt_tokens(served, text)
    requests = await generation_requests(
        f, served, prompt, samplers, n_predict, n_top, tool_call=tool_call
    )
    return ChatRequest(f, served, sessions, text, requests)


async def chat_completions(request: Request) -> Any:
    chat = await chat_request(request)
    f, served, sessions = chat.fields, chat.served, chat.sessions
    want_logprobs = f["logprobs"]
    runs = start_runs(served, chat.requests, f["stop"])
    head = response_head(served, "chat.completion", "chatcmpl")
    if f["stream"]:
        return StreamingResponse(
            _stream(served, f, head, runs, sessions, want_logprobs),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    await run_all(request, runs)
    choices = []
    for i, (run, session) in enumerate(zip(runs, sessions, strict=True)):
        session.feed(run.text)
        result = session.finish()
        logprobs = None
        if want_logprobs:
            logprobs = {"content": [logprob_entry(served, e) for e in run.tokens]}
        choices.append(
            {
                "index": i,
                "message": result.message(),
                "logprobs": logprobs,
                "finish_reason": result.finish_reason or run.finish_reason,
            }
        )
    return JSONResponse(
        {
            **head,
            "object": "chat.completion",
            "choices": choices,
            "usage": usage(runs),
            "timings": timings(runs),
        }
    )


def _stream(
    served: ServedModel,
    f: Fields,
    head: dict,
    runs: list[ChoiceRun],
    sessions: list[ChatSession],
    want_logprobs: bool,
):
    head = {**head, "object": "chat.completion.chunk"}
    include_usage = bool((f["stream_options"] or {}).get("include_usage"))
    pending: list[list[dict]] = [[] for _ in runs]  # logprob entries not yet sent
    called = [False] * len(runs)

    def chunk(i: int, delta: dict, finish: str | None = None) -> dict:
        logprobs = None
        if want_logprobs and pending[i]:
            logprobs, pending[i] = {"content": pending[i]}, []
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**head, "choices": [choice]}

    def deltas(i: int, ds: list[dict]) -> list[dict]:
        called[i] = called[i] or any("tool_calls" in d for d in ds)
        return [chunk(i, d) for d in ds]

    def on_piece(i: int, piece: Piece) -> list[dict]:
        if want_logprobs and piece.token is not None:
            pending[i].append(logprob_entry(served, piece.token))
        return deltas(i, sessions[i].feed(piece.text))

    def on_end(i: int) -> list[dict]:
        out = deltas(i, sessions[i].finish().deltas)
        reason = "tool_calls" if called[i] else runs[i].finish_reason
        last = chunk(i, {}, reason)
        if runs[i].finish is not None:  # llama-server's timings, on each choice's last chunk
            last["timings"] = finish_timings(runs[i].finish)
        return [*out, last]

    def tail() -> list[dict]:
        return [{**head, "choices": [], "usage": usage(runs)}] if include_usage else []

    async def events():
        # the first chunk of each choice carries the role, as OpenAI's do
        for i in range(len(runs)):
            yield sse(chunk(i, {"role": "assistant", "content": ""}))
        async for data in interleave(runs, on_piece, on_end, tail):
            yield data

    return events()

"""Ollama's generation API: POST /api/chat and /api/generate.

An Ollama request is turned into the chat completion body it means (``options`` by
Ollama's names become the sampling fields of :data:`api_fields.CHAT`, ``format: "json"``
becomes ``response_format: json_object``, a schema ``json_schema``) and runs through the
same machinery as ``/v1/chat/completions``: the template, reasoning and tool calls of the
chat plugin's ChatSession, the slot engine, stop strings. Answers are NDJSON lines by
default (``stream: false``: one object), with Ollama's nanosecond durations and token counts.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tessera.contract.routes import ApiError
from tessera.plugins.server.state import ServedModel, ServerState

from .api_fields import CHAT
from .api_fields_ollama import OLLAMA_CHAT, OLLAMA_GENERATE, OLLAMA_OPTIONS
from .chat_completions import chat_session, prompt_tokens
from .content_parts import no_encoder
from .fields import Fields, read_json
from .generation import ChoiceRun, run_all, run_error, start_runs
from .openai_common import generation_requests, max_tokens, sampler_params

#: Ollama's option names -> the chat completion fields they set (num_ctx is ignored: the
#: context is the server's -c, fixed when it starts)
_OPTION_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "typical_p": "typical_p",
    "seed": "seed",
    "num_predict": "n_predict",
    "stop": "stop",
}

NDJSON = "application/x-ndjson"


def ollama_errors(
    handler: Callable[[Request], Awaitable[Any]],
) -> Callable[[Request], Awaitable[Any]]:
    """The handler with its ApiErrors answered in Ollama's shape, ``{"error": message}``."""

    async def endpoint(request: Request) -> Any:
        try:
            return await handler(request)
        except ApiError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)

    return endpoint


def created_at() -> str:
    """Now, as Ollama writes its timestamps (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _think_kwargs(think: Any) -> dict[str, Any] | None:
    """Ollama's ``think`` as chat template variables: the ``enable_thinking`` of Qwen3-style
    templates, and a level as the ``reasoning_effort`` of gpt-oss's."""
    if think is None:
        return None
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think in ("low", "medium", "high"):
        return {"enable_thinking": True, "reasoning_effort": think}
    raise ApiError(400, '\'think\' must be true, false, "low", "medium" or "high"', "think")


def chat_fields(f: Fields, messages: list[dict]) -> Fields:
    """The chat completion body an Ollama request means, checked as one."""
    options = Fields(f["options"] or {}, OLLAMA_OPTIONS)
    body: dict[str, Any] = {"model": f["model"], "messages": messages}
    for name, field in _OPTION_FIELDS.items():
        if options.body.get(name) is not None:
            body[field] = options[name]
    fmt = f["format"]
    if fmt == "json":
        body["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):  # a JSON schema (Ollama's structured outputs)
        body["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt}}
    elif fmt not in (None, ""):
        raise ApiError(400, "'format' must be \"json\" or a JSON schema object", "format")
    if "tools" in f.declared:
        body["tools"] = f["tools"]
    body["chat_template_kwargs"] = _think_kwargs(f["think"])
    chat = Fields(body, CHAT)
    sampler_params(chat, 1)  # the sampler's own ranges, checked before any answer
    return chat


class _Answer:
    """Reads a run's text as Ollama's message (or response) parts: through the chat
    session when there is one, else as it is (``raw``)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def feed(self, text: str) -> list[dict]:
        if self.session is None:
            return [{"content": text}] if text else []
        return self.session.feed(text)

    def finish(self) -> list[dict]:
        return self.session.finish().deltas if self.session is not None else []


def _parts(deltas: list[dict]) -> dict[str, Any]:
    """OpenAI deltas as Ollama's message fields: content, thinking, tool_calls (arguments
    as an object)."""
    out: dict[str, Any] = {"content": ""}
    for d in deltas:
        out["content"] += d.get("content") or ""
        if d.get("reasoning_content"):
            out["thinking"] = out.get("thinking", "") + d["reasoning_content"]
        for call in d.get("tool_calls") or ():
            fn = call["function"]
            args = fn.get("arguments") or "{}"
            out.setdefault("tool_calls", []).append(
                {"function": {"name": fn.get("name"), "arguments": json.loads(args)}}
            )
    return out


def final_stats(run: ChoiceRun, started: float) -> dict[str, Any]:
    """The last object's fields: why it ended, durations in nanoseconds, token counts."""
    fin = run.finish
    return {
        "done": True,
        "done_reason": run.finish_reason,
        "total_duration": int((time.perf_counter() - started) * 1e9),
        "load_duration": 0,  # a served model is loaded before its first request
        "prompt_eval_count": fin.n_prompt,
        "prompt_eval_duration": int(fin.t_prompt_ms * 1e6),
        "eval_count": fin.n_generated,
        "eval_duration": int(fin.t_generate_ms * 1e6),
    }


async def _respond(
    request: Request,
    served: ServedModel,
    f: Fields,
    chat: Fields,
    prompt: list[int],
    answer: _Answer,
    shape: Callable[[dict[str, Any]], dict[str, Any]],
) -> Any:
    started = time.perf_counter()
    n_predict = max_tokens(chat, default=served.settings.default_n_predict(-1))
    samplers = sampler_params(chat, 1, served.settings.sampler)
    requests = await generation_requests(chat, served, prompt, samplers, n_predict, -1)
    (run,) = start_runs(served, requests, chat["stop"])

    def line(parts: dict[str, Any], **more: Any) -> bytes:
        obj = {"model": served.name, "created_at": created_at(), **shape(parts), **more}
        return json.dumps(obj).encode() + b"\n"

    if not f["stream"]:
        await run_all(request, [run])
        deltas = answer.feed(run.text) + answer.finish()
        body = json.loads(line(_parts(deltas), **final_stats(run, started)))
        return JSONResponse(body)

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for piece in run.pieces():
                deltas = answer.feed(piece.text)
                if deltas:
                    yield line(_parts(deltas), done=False)
            if (error := run_error(run)) is not None:
                yield json.dumps({"error": error.message}).encode() + b"\n"
                return
            yield line(_parts(answer.finish()), **final_stats(run, started))
        finally:
            run.cancel()

    return StreamingResponse(lines(), media_type=NDJSON)


def _message(parts: dict[str, Any]) -> dict[str, Any]:
    return {"message": {"role": "assistant", **parts}}


def _response(parts: dict[str, Any]) -> dict[str, Any]:
    out = {"response": parts["content"]}
    if "thinking" in parts:
        out["thinking"] = parts["thinking"]
    return out


@ollama_errors
async def ollama_chat(request: Request) -> Any:
    """POST /api/chat: ``messages`` -> ``message`` ({role, content, thinking, tool_calls})."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), OLLAMA_CHAT)
    chat = chat_fields(f, f["messages"])
    served = await state.model_for(request, f["model"])
    session = chat_session(served, chat)
    prompt = prompt_tokens(served, session.prompt())
    return await _respond(request, served, f, chat, prompt, _Answer(session), _message)


@ollama_errors
async def ollama_generate(request: Request) -> Any:
    """POST /api/generate: ``prompt`` (+ ``system``) as one user turn, or as it is with
    ``raw``; an empty prompt only loads the model (``done_reason: "load"``)."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), OLLAMA_GENERATE)
    if f.body.get("images"):
        raise no_encoder("vision")
    text = f["prompt"]
    messages = [{"role": "system", "content": f["system"]}] if f["system"] else []
    messages.append({"role": "user", "content": text})
    chat = chat_fields(f, messages)
    served = await state.model_for(request, f["model"])
    if not text:
        head = {"model": served.name, "created_at": created_at(), "response": ""}
        return JSONResponse({**head, "done": True, "done_reason": "load"})
    if f["raw"]:
        prompt = served.tokenizer.encode(text, add_special=True, parse_special=True)
        return await _respond(request, served, f, chat, prompt, _Answer(None), _response)
    session = chat_session(served, chat)
    prompt = prompt_tokens(served, session.prompt())
    return await _respond(request, served, f, chat, prompt, _Answer(session), _response)

"""The server's API as an OpenAPI 3.1 document, served at ``/openapi.json``.

Request bodies come from the field declarations of
:mod:`tessera.plugins.server.api_fields` and its siblings (the same ones the handlers
check), responses
from the shapes below. Every route a plugin registers with an ``openapi`` operation
(:class:`tessera.contract.routes.ServerRoute`) is listed; routes without one are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.contract.routes import ServerRoute

from . import api_fields as af
from . import api_fields_anthropic as anthropic
from . import api_fields_native as native
from . import api_fields_ollama as ollama
from .field_decl import Field

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


#: llama-server's error object (its native routes): the HTTP status as ``code``; a prompt
#: too long is ``exceed_context_size_error`` with ``n_prompt_tokens`` and ``n_ctx``. Refusals
#: before the handler (API key, body size) keep OpenAI's shape.
NATIVE_ERROR = {
    "anyOf": [
        {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message", "type"],
                    "properties": {
                        "code": {"type": "integer"},
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "n_prompt_tokens": {"type": "integer"},
                        "n_ctx": {"type": "integer"},
                    },
                }
            },
        },
        ERROR,
    ]
}


def _obj(*required: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": properties}


_LIST = {"type": "array"}
_STRING = {"type": "string"}
_COMPLETION = _obj("id", "object", "created", "model", "choices", choices=_LIST)
#: One server-sent event (what an SSE schema describes): its ``data`` line, a JSON chunk
#: or OpenAI's ``[DONE]``.
_SSE_EVENT = _obj("data", data=_STRING, event=_STRING)
_STREAM = {"text/event-stream": {"schema": _SSE_EVENT}}


def body(fields: Mapping[str, Field]) -> dict[str, Any]:
    """A JSON request body of the declared ``fields``."""
    schema = {
        "type": "object",
        "required": [f.name for f in fields.values() if f.required],
        "properties": {f.name: f.json_schema() for f in fields.values()},
    }
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def operation(
    summary: str,
    ok: Mapping[str, Any],
    fields: Mapping[str, Field] | None = None,
    more_ok: Mapping[str, Any] | None = None,
    error_schema: Mapping[str, Any] = ERROR,
    **extra: Any,
) -> dict[str, Any]:
    """An operation answering 200 with ``ok`` JSON (or ``more_ok`` media types) and, on
    any refusal, ``error_schema`` (OpenAI's error object unless told)."""
    error = {
        "description": "refused",
        "content": {"application/json": {"schema": error_schema}},
    }
    content = {"application/json": {"schema": ok}, **(more_ok or {})}
    out: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "ok", "content": content}, "4XX": error},
        **extra,
    }
    out["responses"]["5XX"] = error
    if fields is not None:
        out["requestBody"] = body(fields)
        out["requestBody"]["required"] = any(f.required for f in fields.values())
    return out


_GENERATION = {"more_ok": _STREAM}
_NATIVE = {"more_ok": _STREAM, "error_schema": NATIVE_ERROR}
# no field is required: response_fields may keep any of them (content, tokens, stop,
# stop_type, stopping_word, timings, generation_settings, tokens_cached ...)
_NATIVE_RESULT = {
    "type": "object",
    "properties": {
        "content": _STRING,
        "tokens": {"type": "array", "items": {"type": "integer"}},
        "stop": {"type": "boolean"},
        "stop_type": {"type": "string", "enum": ["none", "eos", "limit", "word"]},
        "timings": {"type": "object"},
    },
}
_NATIVE_COMPLETION = {"anyOf": [_NATIVE_RESULT, {"type": "array", "items": _NATIVE_RESULT}]}
_RERANKED = {
    "anyOf": [_obj("model", "object", "usage", "results", results=_LIST), {"type": "array"}]
}
#: Ollama's routes: one object, or NDJSON lines when streaming (its default)
_NDJSON = {"application/x-ndjson": {"schema": {"type": "object"}}}
#: Ollama's error object; refusals before the handler (API key, body size) keep OpenAI's
_OLLAMA = {"error_schema": {"anyOf": [_obj("error", error=_STRING), ERROR]}}
_OLLAMA_MODELS = _obj("models", models={"type": "array", "items": _obj("name", "model", "size")})
OLLAMA_OPERATIONS = {
    "ollama_chat": operation(
        "Ollama's chat", _obj("model", "created_at", "message", "done"), ollama.OLLAMA_CHAT,
        more_ok=_NDJSON, **_OLLAMA,
    ),
    "ollama_generate": operation(
        "Ollama's generate", _obj("model", "created_at", "response", "done"),
        ollama.OLLAMA_GENERATE, more_ok=_NDJSON, **_OLLAMA,
    ),
    "ollama_tags": operation("Ollama's list of models", _OLLAMA_MODELS, **_OLLAMA),
    "ollama_ps": operation("Ollama's models in memory", _OLLAMA_MODELS, **_OLLAMA),
    "ollama_show": operation(
        "Ollama's model details", _obj("details", "model_info", "capabilities"),
        ollama.OLLAMA_SHOW, **_OLLAMA,
    ),
    "ollama_embed": operation(
        "Ollama's embeddings", _obj("model", "embeddings", embeddings=_LIST),
        ollama.OLLAMA_EMBED, **_OLLAMA,
    ),
    "ollama_embeddings": operation(
        "Ollama's older embeddings route", _obj("embedding", embedding=_LIST),
        ollama.OLLAMA_EMBEDDINGS, **_OLLAMA,
    ),
    "ollama_version": operation(
        "the server's version", _obj("version", version=_STRING), **_OLLAMA
    ),
}  # fmt: skip
#: Anthropic's error object; refusals before the handler (API key, body size) keep OpenAI's
ANTHROPIC_ERROR = {
    "anyOf": [_obj("type", "error", error=_obj("type", "message", message=_STRING)), ERROR]
}
ANTHROPIC_OPERATIONS = {
    "anthropic_messages": operation(
        "Anthropic's Messages API", _obj("id", "type", "role", "content", "stop_reason", "usage"),
        anthropic.ANTHROPIC_MESSAGES, more_ok=_STREAM, error_schema=ANTHROPIC_ERROR,
    ),
    "anthropic_count_tokens": operation(
        "the prompt tokens a Messages request would evaluate",
        _obj("input_tokens", input_tokens={"type": "integer"}), anthropic.ANTHROPIC_PROMPT,
        error_schema=ANTHROPIC_ERROR,
    ),
}  # fmt: skip
#: The server plugin's operations by handler name (ServerRoute.name).
OPERATIONS: dict[str, dict[str, Any]] = {
    "health": operation("200 when every engine serves; 503 with the reason", _obj("status")),
    "models": operation("the served models", _obj("object", "data", data=_LIST)),
    "props": operation("the server's settings and paths", {"type": "object"}),
    "models_load": operation(
        "a router's model starts loading (--models-dir or several -m)", _obj("success"),
        native.ROUTER_MODEL, error_schema=NATIVE_ERROR,
    ),
    "models_unload": operation(
        "a router's model is unloaded", _obj("success"), native.ROUTER_MODEL,
        error_schema=NATIVE_ERROR,
    ),
    "metrics": operation(
        "Prometheus metrics", _STRING, more_ok={"text/plain": {"schema": _STRING}}
    ),
    "tokenize": operation("text to token ids", _obj("tokens"), native.TOKENIZE),
    "detokenize": operation(
        "token ids to text", _obj("content", content=_STRING), native.DETOKENIZE
    ),
    "slots": operation("each slot's state (501 with --no-slots)", _LIST),
    "slot_action": operation(
        "save, restore or erase a slot's KV cache (save/restore need --slot-save-path)",
        {"type": "object"},
        native.SLOT_FILE,
        parameters=[
            {"name": "id_slot", "in": "path", "required": True, "schema": {"type": "integer"}},
            {
                "name": "action",
                "in": "query",
                "required": True,
                "schema": {"type": "string", "enum": ["save", "restore", "erase"]},
            },
        ],
    ),
    "completions": operation("text completion", _COMPLETION, af.COMPLETIONS, **_GENERATION),
    "chat_completions": operation("chat completion", _COMPLETION, af.CHAT, **_GENERATION),
    "embeddings": operation(
        "embedding vectors",
        _obj("object", "data", "model", "usage", data=_LIST),
        af.EMBEDDINGS,
    ),
    "rerank": operation(
        "documents ranked by relevance to a query (Jina's form; TEI's with 'texts')",
        _RERANKED,
        af.RERANK,
    ),
    "update_props": operation(
        "llama-server's POST /props (needs --props; nothing can be changed yet)",
        _obj("success"),
        native.PROPS_UPDATE,
    ),
    "lora_adapters": operation("the LoRA adapters loaded (none)", _LIST),
    "set_lora_adapters": operation(
        "set the LoRA adapters' scales: [] (no adapter is loaded)", _obj("success"),
        requestBody={"required": True,
                     "content": {"application/json": {"schema": native.LORA_SCALES}}},
        error_schema=NATIVE_ERROR,
    ),
    "native_completion": operation(
        "llama-server's native completion", _NATIVE_COMPLETION, native.NATIVE_COMPLETION,
        **_NATIVE,
    ),
    "infill": operation(
        "fill in the middle with the model's FIM tokens", _NATIVE_COMPLETION, native.INFILL,
        **_NATIVE,
    ),
    "native_embedding": operation(
        "llama-server's native embeddings: per input, its pooled vector or a vector per token",
        {"type": "array", "items": _obj("index", "embedding", embedding=_LIST)},
        native.NATIVE_EMBEDDING,
        error_schema=NATIVE_ERROR,
    ),
    "apply_template": operation(
        "a chat request's prompt, rendered by the chat template",
        _obj("prompt", prompt=_STRING),
        af.CHAT,
    ),
    "chat_input_tokens": operation(
        "the prompt tokens a chat request would evaluate",
        _obj("object", "input_tokens", input_tokens={"type": "integer"}),
        af.CHAT,
    ),
    **OLLAMA_OPERATIONS,
    **ANTHROPIC_OPERATIONS,
}  # fmt: skip


def document(routes: Iterable[ServerRoute], version: str, api_key: bool) -> dict[str, Any]:
    """The OpenAPI document of ``routes``; with ``api_key``, non-public routes declare the
    bearer scheme."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        if route.openapi is None:
            continue
        op = dict(route.openapi)
        if api_key and not route.public:
            op["security"] = [{"bearer": []}]
        for method in route.methods:
            # one operationId per path and method (aliases such as /v1/x and /x differ)
            op_id = (
                f"{method.lower()}{route.path.replace('/', '_').replace('{', '').replace('}', '')}"
            )
            paths.setdefault(route.path, {})[method.lower()] = {**op, "operationId": op_id}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tessera", "version": version},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }

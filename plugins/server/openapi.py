"""The server's API as an OpenAPI 3.1 document, served at ``/openapi.json``.

Request bodies come from the field declarations of
:mod:`tessera.plugins.server.api_fields` (the same ones the handlers check), responses
from the shapes below. Every route a plugin registers with an ``openapi`` operation
(:class:`tessera.contract.routes.ServerRoute`) is listed; routes without one are not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.contract.routes import ServerRoute

from . import api_fields
from .api_fields import Field

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


def _obj(*required: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(required), "properties": properties}


_LIST = {"type": "array"}
_STRING = {"type": "string"}
_COMPLETION = _obj("id", "object", "created", "model", "choices", choices=_LIST)
_STREAM = {"text/event-stream": {"schema": _STRING}}


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
    **extra: Any,
) -> dict[str, Any]:
    """An operation answering 200 with ``ok`` JSON (or ``more_ok`` media types) and, on
    any refusal, OpenAI's error object."""
    error = {"description": "refused", "content": {"application/json": {"schema": ERROR}}}
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
#: The server plugin's operations by handler name (ServerRoute.name).
OPERATIONS: dict[str, dict[str, Any]] = {
    "health": operation("200 when every engine serves; 503 with the reason", _obj("status")),
    "models": operation("the served models", _obj("object", "data", data=_LIST)),
    "props": operation("the server's settings and paths", {"type": "object"}),
    "metrics": operation(
        "Prometheus metrics", _STRING, more_ok={"text/plain": {"schema": _STRING}}
    ),
    "tokenize": operation("text to token ids", _obj("tokens"), api_fields.TOKENIZE),
    "detokenize": operation(
        "token ids to text", _obj("content", content=_STRING), api_fields.DETOKENIZE
    ),
    "slots": operation("each slot's state", _LIST),
    "slot_action": operation(
        "save, restore or erase a slot's KV cache (save/restore need --slot-save-path)",
        {"type": "object"},
        api_fields.SLOT_FILE,
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
    "completions": operation("text completion", _COMPLETION, api_fields.COMPLETIONS, **_GENERATION),
    "chat_completions": operation("chat completion", _COMPLETION, api_fields.CHAT, **_GENERATION),
    "embeddings": operation(
        "embedding vectors",
        _obj("object", "data", "model", "usage", data=_LIST),
        api_fields.EMBEDDINGS,
    ),
    "rerank": operation(
        "documents ranked by relevance to a query",
        _obj("model", "results", results=_LIST),
        api_fields.RERANK,
    ),
}


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

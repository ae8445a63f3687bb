"""What a route plugin registers (:class:`ServerRoute`) and what its handler can reach.

A handler is an async Starlette endpoint. ``request.app.state.tessera`` is the
:class:`ServerState`; raising :class:`ApiError` answers with OpenAI's error JSON::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}
"""

from __future__ import annotations

import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

#: OpenAI error ``type`` for each HTTP status the server uses.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


class ApiError(Exception):
    """An HTTP error with a message a client can act on."""

    def __init__(
        self, status: int, message: str, param: str | None = None, *, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": ERROR_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }


@attrs.frozen
class ServerRoute:
    """One HTTP route: Starlette path syntax (``/slots/{id_slot}``), handler and methods."""

    path: str
    endpoint: Callable[[Any], Awaitable[Any]] = attrs.field(eq=False, repr=False)
    methods: tuple[str, ...] = ("GET",)
    #: Reachable without the API key (``/health``, the web UI's static files).
    public: bool = False
    name: str = ""


def lazy_routes(
    package: str, table: Iterable[tuple[str, str, str, tuple[str, ...], bool]], prefix: str = ""
) -> list[ServerRoute]:
    """Routes from ``(path, module, handler, methods, public)`` rows whose handler,
    ``package.module.handler``, is imported on its first call, so that a route plugin's
    entry module stays light (no Starlette import for ``tessera plugins``)."""

    def lazy(module: str, name: str) -> Callable[[Any], Awaitable[Any]]:
        async def endpoint(request: Any) -> Any:
            handler = getattr(importlib.import_module(f"{package}.{module}"), name)
            return await handler(request)

        endpoint.__name__ = name
        return endpoint

    return [
        ServerRoute(path, lazy(module, name), methods, public, prefix + name)
        for path, module, name, methods, public in table
    ]


@attrs.frozen
class ServerSettings:
    """``tessera serve`` flags the handlers need."""

    host: str = "127.0.0.1"
    port: int = 9931
    api_key: str | None = None
    #: Largest request body accepted (413 above it).
    max_body_bytes: int = 1 << 20
    #: Upper bound on any request's max_tokens (-1 = none).
    max_tokens_cap: int = -1
    #: Where slot files go; None = slot save/restore off (501).
    slot_save_path: Path | None = None
    #: The name clients use in the ``model`` field (default: the file name).
    alias: str = ""
    #: /v1/embeddings pooling (None: the model's own) and normalisation (llama.cpp's
    #: --embd-normalize: -1 none, 0 max-abs, 1 taxicab, 2 L2, >2 p-norm).
    pooling: str | None = None
    embd_normalize: int = 2


@attrs.define(eq=False)
class ServedModel:
    """One model a server answers with: the model, its tokenizer and slot engine."""

    #: The name clients use in the ``model`` field.
    name: str
    path: str
    model: Any
    tokenizer: Any
    engine: Any
    #: ``--chat-template`` (None: the model's own).
    chat_template: str | None
    settings: ServerSettings
    #: Lazily built :class:`tessera.embedding.Embedder` (its own context, never the slots').
    embedder: Any = None
    #: Per-model state of plugins (e.g. the JSON-constraint tables of its vocabulary).
    extras: dict[str, Any] = attrs.field(factory=dict)

    def check_generates(self) -> None:
        """ApiError 400 for an encoder (BERT ...), which embeds but cannot generate."""
        if not self.model.arch.causal_attention(self.model.config):
            raise ApiError(
                400,
                f"model '{self.name}' is an encoder: it embeds and reranks but cannot "
                "generate; use /v1/embeddings or /v1/rerank, or serve a generative model",
                "model",
            )


class ModelPool(ABC):
    """The models a server serves. The single-model pool answers every ``model`` name
    with its one model, as llama.cpp does; a multi-model pool routes by name and may load
    and unload models on demand."""

    @abstractmethod
    async def acquire(self, name: str | None) -> ServedModel:
        """The model a request names (None: the default); ApiError 404 if none."""

    @abstractmethod
    def served(self) -> list[ServedModel]:
        """The models loaded now."""

    def describe(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries (``id``, ``object``, ``context_length`` ...)."""
        return [describe_model(m) for m in self.served()]

    def start(self) -> None:
        for m in self.served():
            m.engine.start()

    def close(self) -> None:
        for m in self.served():
            m.engine.stop()


def describe_model(served: ServedModel, created: int = 0) -> dict[str, Any]:
    """The ``/v1/models`` entry of a loaded model."""
    model, n_ctx = served.model, served.engine.ctx.n_ctx
    return {
        "id": served.name,
        "object": "model",
        "created": created,
        "owned_by": "tessera",
        "context_length": n_ctx,
        "meta": {
            "n_ctx": n_ctx,
            "n_ctx_train": model.n_ctx_train,
            "n_vocab": model.n_vocab,
            "architecture": model.arch.names[0] if model.arch.names else "",
            "path": served.path,
        },
    }


class SingleModelPool(ModelPool):
    def __init__(self, model: ServedModel) -> None:
        self.model = model

    async def acquire(self, name: str | None) -> ServedModel:
        return self.model

    def served(self) -> list[ServedModel]:
        return [self.model]


@attrs.define
class ServerState:
    """Everything a route handler can use: settings and the pool of served models."""

    runtime: Any
    settings: ServerSettings
    pool: ModelPool
    started: float = attrs.field(factory=time.time)
    #: Plugins may keep their own state here, under their plugin name.
    extras: dict[str, Any] = attrs.field(factory=dict)
    #: Extra /metrics counters: each callable returns ``{name: (value, help, type)}`` with
    #: type "counter" or "gauge" (speculative decoding, the MoE expert cache ...).
    metric_sources: list[Callable[[], dict[str, tuple[float, str, str]]]] = attrs.field(
        factory=list
    )

    async def model_for(self, request: Any, name: str | None = None) -> ServedModel:
        """The model a request is for: ``name`` (the body's ``model``), else the
        ``?model=`` query parameter, else the default."""
        return await self.pool.acquire(name or request.query_params.get("model"))

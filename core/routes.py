"""What a route plugin registers (:class:`ServerRoute`) and what its handler can reach.

A handler is an async Starlette endpoint. ``request.app.state.tessera`` is the
:class:`ServerState`; raising :class:`ApiError` answers with OpenAI's error JSON::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
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


@attrs.define
class ServerState:
    """Everything a route handler can use: the model, its tokenizer, the slot engine."""

    runtime: Any
    settings: ServerSettings
    model: Any
    model_path: str
    tokenizer: Any
    engine: Any
    chat_template: str | None
    started: float = attrs.field(factory=time.time)
    #: Lazily built :class:`tessera.embedding.Embedder` (its own context, never the slots').
    embedder: Any = None
    #: Plugins may keep their own state here, under their plugin name.
    extras: dict[str, Any] = attrs.field(factory=dict)
    #: Extra /metrics counters: each callable returns ``{name: (value, help, type)}`` with
    #: type "counter" or "gauge" (speculative decoding, the MoE expert cache ...).
    metric_sources: list[Callable[[], dict[str, tuple[float, str, str]]]] = attrs.field(
        factory=list
    )

    @property
    def model_name(self) -> str:
        return self.settings.alias or Path(self.model_path).name

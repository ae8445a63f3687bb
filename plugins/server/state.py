"""The server's state, as its route handlers (and other route plugins) reach it.

``request.app.state.tessera`` is a :class:`ServerState`: the settings of ``tessera serve``
and the pool of models it answers with. This module is the server plugin's public module:
other plugins (the web UI) import it, and nothing else of the server.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tessera.contract.routes import ApiError
from tessera.engine.sampling import SamplerParams


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
    #: More accepted keys (llama-server's comma-separated --api-key and --api-key-file).
    more_api_keys: tuple[str, ...] = ()
    #: llama-server's endpoint switches: GET /slots and /metrics (off: 501), POST /props.
    endpoint_slots: bool = True
    endpoint_metrics: bool = True
    endpoint_props: bool = False
    #: CORS (llama-server's --cors-*): allowed origins ("*", "localhost" or a
    #: comma-separated list), methods and headers of a preflight, credentials allowed.
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    #: /infill lays the suffix before the prefix (llama.cpp's --spm-infill).
    spm_infill: bool = False
    #: The access log's format: one line per request on stderr, "text", "json" or "off".
    log_format: str = "text"
    #: Sampling settings of a request that sets none (--temp, --top-k ... as llama-server);
    #: a request's own field overrides its setting here.
    sampler: SamplerParams = attrs.field(factory=SamplerParams)
    #: Most tokens to generate when a request does not say (-n; None: each route's own).
    n_predict: int | None = None

    def default_n_predict(self, route_default: int) -> int:
        """-n when it was given, else ``route_default`` (OpenAI's 16 for completions)."""
        return route_default if self.n_predict is None else self.n_predict

    @property
    def api_keys(self) -> tuple[str, ...]:
        """Every key a request may carry (none: the API is open)."""
        return ((self.api_key,) if self.api_key else ()) + self.more_api_keys


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
    #: Lazily built :class:`tessera.engine.embed.Embedder` (its own context, never the slots').
    embedder: Any = None
    #: Per-model state of plugins (e.g. the JSON-constraint tables of its vocabulary).
    extras: dict[str, Any] = attrs.field(factory=dict)
    #: The plugin manager the model was loaded with (its catalogues: constraint kinds).
    runtime: Any = None

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
    async def acquire(self, name: str | None, autoload: bool | None = None) -> ServedModel:
        """The model a request names (None: the default); ApiError 404 if none. A pool
        that loads models on demand refuses one not loaded when ``autoload`` is False
        (None: the server's --models-autoload)."""

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

    async def acquire(self, name: str | None, autoload: bool | None = None) -> ServedModel:
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
    #: Set when a shutdown began (SIGTERM): new requests get 503 with Retry-After.
    draining: bool = False
    #: Plugins may keep their own state here, under their plugin name.
    extras: dict[str, Any] = attrs.field(factory=dict)
    #: Extra /metrics counters: each callable returns ``{name: (value, help, type)}`` with
    #: type "counter" or "gauge" (speculative decoding, the MoE expert cache ...).
    metric_sources: list[Callable[[], dict[str, tuple[float, str, str]]]] = attrs.field(
        factory=list
    )

    async def model_for(self, request: Any, name: str | None = None) -> ServedModel:
        """The model a request is for: ``name`` (the body's ``model``), else the
        ``?model=`` query parameter, else the default; loaded on demand unless
        ``?autoload=false`` (or --no-models-autoload without ``?autoload=true``)."""
        autoload = request.query_params.get("autoload")
        wanted = None if autoload is None else autoload in ("true", "1")
        return await self.pool.acquire(name or request.query_params.get("model"), wanted)


def engine_problem(state: ServerState) -> str | None:
    """Why the server cannot serve: the first loaded model whose engine is dead or stalled
    (``SlotEngine.health``), as ``model 'NAME': reason``; None when all are healthy."""
    for served in state.pool.served():
        ok, reason = served.engine.health()
        if not ok:
            return f"model '{served.name}': {reason}"
    return None

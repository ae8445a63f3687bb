"""The ASGI app: the registered routes, the API key check, the body limit, CORS, error JSON."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tessera.contract.routes import ApiError, ServerRoute
from tessera.plugins.server.state import ServerState

from .access_log import AccessLog
from .cors import Cors

log = logging.getLogger("tessera.server")


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def check_api_key(request: Request, api_keys: Sequence[str]) -> None:
    """Raise 401 unless the request carries one of ``api_keys``, as
    ``Authorization: Bearer <key>`` or (as llama-server also takes it) ``X-Api-Key: <key>``."""
    if not api_keys:
        return
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, given = header.strip().partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
    else:  # llama-server's other header (Anthropic's clients send it)
        given = request.headers.get("x-api-key", "").strip()
    # constant-time compares, every key tried: a timing side channel must not leak a key
    matches = [hmac.compare_digest(given.encode(), key.encode()) for key in api_keys]
    if not any(matches):
        raise ApiError(
            401,
            "invalid or missing API key; send 'Authorization: Bearer <key>' (or 'X-Api-Key: "
            "<key>') with a key the server was started with (--api-key)",
            code="invalid_api_key",
        )


def _guarded(route: ServerRoute) -> Any:
    async def endpoint(request: Request) -> Any:
        state: ServerState = request.app.state.tessera
        if state.draining and not route.public:
            error = ApiError(503, "the server is shutting down; retry on another instance")
            return JSONResponse(error.body(), status_code=503, headers={"Retry-After": "1"})
        if not route.public:
            check_api_key(request, state.settings.api_keys)
        return await route.endpoint(request)

    return endpoint


#: Bodies declared too large are read and dropped up to this size before the 413.
_DRAIN_LIMIT = 64 << 20


async def _drain(receive: Any, message: dict) -> None:
    """Read the rest of a body away: a client still sending when the answer comes would
    see a reset connection instead of the 413."""
    drained = 0
    while message["type"] == "http.request" and message.get("more_body"):
        if drained > _DRAIN_LIMIT:
            return
        message = await receive()
        drained += len(message.get("body", b""))


class BodyLimit:
    """ASGI middleware: answer 413 to bodies over ``max_bytes`` (declared or streamed)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(receive, {"type": "http.request", "more_body": True})
            await self._too_large(send)
            return
        seen = 0

        async def counting_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # a chunked body: the handler answers 413
                    await _drain(receive, message)
                    raise self._error()
            return message

        await self.app(scope, counting_receive, send)

    def _error(self) -> ApiError:
        return ApiError(
            413,
            f"the request body is larger than the server's limit of {self.max_bytes} bytes; "
            "send less or start the server with a larger --max-body-mib",
        )

    async def _too_large(self, send: Any) -> None:
        body = json.dumps(self._error().body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    message = {
        404: f"no route {request.url.path}; see /v1/models, /v1/chat/completions, /health",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(ApiError(exc.status_code, message))


async def _client_gone(request: Request, exc: Exception) -> JSONResponse:
    # the client left before its body was complete: nothing to answer, nothing to log
    log.debug("client disconnected while sending %s", request.url.path)
    return error_response(ApiError(400, "the client disconnected before the body was complete"))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))


def build_app(state: ServerState, routes: Iterable[ServerRoute], lifespan: Any = None) -> Any:
    """A Starlette app serving ``routes`` over ``state``, wrapped in the body limit, CORS
    (so that refusals carry its headers too) and, outermost, the access log (so that every
    answer, refusals included, has its line)."""
    unique = {id(r): r for r in routes}.values()
    app = Starlette(
        routes=[
            Route(r.path, _guarded(r), methods=list(r.methods), name=r.name or None) for r in unique
        ],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _unexpected,
        },
        lifespan=lifespan,
    )
    app.state.tessera = state
    app.state.routes = list(unique)  # for /openapi.json
    wrapped = Cors(BodyLimit(app, state.settings.max_body_bytes), state.settings)
    return AccessLog(wrapped, state.settings.log_format)

"""What a route plugin registers (:class:`ServerRoute`), and the error a handler raises.

A handler is an async Starlette endpoint. Under ``tessera serve``,
``request.app.state.tessera`` is the server plugin's state
(:class:`tessera.plugins.server.state.ServerState`, the server's public module); raising
:class:`ApiError` answers with OpenAI's error JSON::

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": null}}
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs

#: OpenAI error ``type`` for each HTTP status the server uses (llama-server's names); any
#: other status is ``invalid_request_error`` below 500 and ``server_error`` from 500 on.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


class ApiError(Exception):
    """An HTTP error with a message a client can act on.

    ``code`` is OpenAI's: a string naming the case (``invalid_api_key``,
    ``context_length_exceeded``, ``model_not_found``) or None, sent as null. (llama-server
    sends the HTTP status there; OpenAI's clients type it as a string.)
    """

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
                "type": error_type(self.status),
                "param": self.param,
                "code": self.code,
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
    #: The route's OpenAPI 3.1 operation object (summary, requestBody, responses ...), for
    #: the server's ``/openapi.json``; a route without one is served but not listed.
    openapi: Mapping[str, Any] | None = attrs.field(default=None, eq=False, repr=False)


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

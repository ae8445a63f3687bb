"""CORS as llama-server answers it: ``Access-Control-Allow-*`` headers and preflights.

``--cors-origins`` is ``*`` by default, and with credentials allowed (the default) the
request's ``Origin`` is echoed back, so any page may call the server; ``localhost`` echoes
only origins on localhost, 127.0.0.1 or ::1 (any port); anything else is a comma-separated
list of the origins allowed. Every ``OPTIONS`` request is a preflight, answered 200 with an
empty body before routing and before the API key check (browsers send no credentials
with it).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tessera.plugins.server.state import ServerSettings

_LOCALHOST = {"localhost", "127.0.0.1", "::1"}


def origin_is_localhost(origin: str) -> bool:
    """True for ``http(s)://localhost[:port]``, 127.0.0.1 and [::1]."""
    try:
        return urlsplit(origin).hostname in _LOCALHOST
    except ValueError:  # a malformed port or bracket
        return False


def allowed_origin(settings: ServerSettings, origin: str | None) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for a request from ``origin`` (None: no
    header, the browser refuses the response)."""
    origins = settings.cors_origins.strip()
    if origins == "*":
        # a literal * forbids credentials, so with them the origin itself is named
        return origin if settings.cors_credentials else "*"
    if not origin:
        return None
    if origins == "localhost":
        return origin if origin_is_localhost(origin) else None
    listed = {o.strip().rstrip("/") for o in origins.split(",") if o.strip()}
    return origin if origin.rstrip("/") in listed else None


class Cors:
    """ASGI middleware adding CORS headers to every answer and answering preflights."""

    def __init__(self, app: Any, settings: ServerSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_headers = {k.lower(): v for k, v in scope.get("headers") or []}
        origin = request_headers.get(b"origin", b"").decode("latin-1") or None
        allow = allowed_origin(self.settings, origin)
        added = self._origin_headers(allow)
        if scope["method"] == "OPTIONS":
            await self._preflight(send, added, request_headers)
            return

        async def with_cors(message: dict) -> None:
            if message["type"] == "http.response.start" and added:
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, with_cors)

    def _origin_headers(self, allow: str | None) -> list[tuple[bytes, bytes]]:
        if allow is None:
            return []
        out = [(b"access-control-allow-origin", allow.encode("latin-1"))]
        if allow != "*":
            out.append((b"vary", b"Origin"))  # the answer depends on who asks
            if self.settings.cors_credentials:
                out.append((b"access-control-allow-credentials", b"true"))
        return out

    async def _preflight(self, send: Any, added: list, request_headers: dict) -> None:
        s = self.settings
        allow_headers = s.cors_headers.encode("latin-1")
        asked = request_headers.get(b"access-control-request-headers")
        if s.cors_headers.strip() == "*" and asked:
            # with credentials a browser reads * as a header name, and never lets it cover
            # Authorization: naming what the page asks for is what * means
            allow_headers = asked
        headers = [
            *[h for h in added if h[0] != b"access-control-allow-credentials"],
            (b"access-control-allow-credentials", b"true" if s.cors_credentials else b"false"),
            (b"access-control-allow-methods", s.cors_methods.encode("latin-1")),
            (b"access-control-allow-headers", allow_headers),
            (b"content-type", b"text/html"),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

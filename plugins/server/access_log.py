"""The server's access log: one line on stderr per HTTP request, as text or JSON
(``--log-format text|json|off``).

A line has the request's method and path (never its query string or body: they may hold
keys and private text), the status sent, the time from the request's arrival to its last
byte, and the tokens it cost: the prompt tokens evaluated or embedded and the tokens
generated, summed over the request's choices. Handlers report tokens with
:func:`count_tokens`; the count travels in a context variable, which asyncio copies into
the tasks a handler starts, so choices run with ``gather`` add to the same count::

    2026-05-01T12:00:00.123Z POST /v1/chat/completions 200 812.4 ms tokens 17+32
    {"time": "...", "method": "POST", "path": "/v1/chat/completions", "status": 200,
     "duration_ms": 812.4, "prompt_tokens": 17, "completion_tokens": 32}
"""

from __future__ import annotations

import contextvars
import datetime
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

LOG_FORMATS = ("text", "json", "off")


@attrs.define
class TokenCount:
    prompt: int = 0
    completion: int = 0


_REQUEST_TOKENS: contextvars.ContextVar[TokenCount | None] = contextvars.ContextVar(
    "tessera_request_tokens", default=None
)


def count_tokens(n_prompt: int, n_completion: int = 0) -> None:
    """Add to the running request's token count (no-op outside a logged request)."""
    count = _REQUEST_TOKENS.get()
    if count is not None:
        count.prompt += n_prompt
        count.completion += n_completion


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def access_record(
    method: str, path: str, status: int | None, seconds: float, tokens: TokenCount
) -> dict[str, Any]:
    """The fields of one line (``status`` None: the client left before any answer)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return {
        "time": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": round(seconds * 1e3, 1),
        "prompt_tokens": tokens.prompt,
        "completion_tokens": tokens.completion,
    }


def format_record(record: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(record, ensure_ascii=False)
    status = "-" if record["status"] is None else record["status"]
    return (
        f"{record['time']} {record['method']} {record['path']} {status} "
        f"{record['duration_ms']:.1f} ms tokens {record['prompt_tokens']}+"
        f"{record['completion_tokens']}"
    )


class AccessLog:
    """ASGI middleware writing one line per HTTP request through ``write``."""

    def __init__(
        self, app: Any, fmt: str = "text", write: Callable[[str], None] = _stderr_line
    ) -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
        self.app = app
        self.fmt = fmt
        self.write = write

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.fmt == "off":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status: list[int] = []
        tokens = TokenCount()
        reset = _REQUEST_TOKENS.set(tokens)

        async def noting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            _REQUEST_TOKENS.reset(reset)
            record = access_record(
                scope.get("method", ""),
                scope.get("path", ""),
                status[0] if status else None,
                time.perf_counter() - t0,
                tokens,
            )
            self.write(format_record(record, self.fmt))

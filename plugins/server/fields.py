"""Reading a JSON request body and its fields, with a 400 naming the bad field."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from tessera.contract.routes import ApiError

_MISSING = object()


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or 400 saying why it is not one."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


class Fields:
    """Typed access to a request object's fields; unknown fields are ignored."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def _bad(self, name: str, want: str) -> ApiError:
        return ApiError(400, f"'{name}' must be {want}, got {self.body.get(name)!r}", param=name)

    def get(self, name: str, default: Any = None) -> Any:
        value = self.body.get(name, default)
        return default if value is None else value

    def required(self, name: str) -> Any:
        if self.body.get(name) is None:
            raise ApiError(400, f"'{name}' is required", param=name)
        return self.body[name]

    def integer(
        self, name: str, default: int | None, lo: int | None = None, hi: int | None = None
    ) -> int | None:
        value = self.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(name, "an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise self._bad(name, f"an integer {span}")
        return value

    def number(
        self, name: str, default: float | None, lo: float | None = None, hi: float | None = None
    ) -> float | None:
        value = self.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, "a number")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise self._bad(name, f"a number {span}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise self._bad(name, "true or false")
        return value

    def string_list(self, name: str) -> list[str]:
        """A string or a list of strings (OpenAI's ``stop``), as a list."""
        value = self.get(name, [])
        if isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(name, "a string or a list of strings")
        return value

    def obj(self, name: str) -> dict[str, Any] | None:
        value = self.get(name)
        if value is not None and not isinstance(value, dict):
            raise self._bad(name, "an object")
        return value

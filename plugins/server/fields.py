"""Reading a JSON request body and its fields, with a 400 naming the bad field."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from tessera.contract.routes import ApiError

from .field_decl import Field


def _span(lo: float | None, hi: float | None) -> str:
    """`` between 0 and 1``, `` >= 1``: the range in an error message."""

    def show(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if lo is not None and hi is not None:
        return f" between {show(lo)} and {show(hi)}"
    if lo is not None:
        return f" >= {show(lo)}"
    return f" <= {show(hi)}" if hi is not None else ""


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or 400 saying why it is not one."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, 5000-digit ints
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def token_ids(value: Any, n_vocab: int, name: str) -> list[int] | None:
    """``value`` as a non-empty list of token ids, None if it is not a list of integers;
    an id outside the vocabulary is a 400 here, before the engine sees it."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    bad = next((t for t in value if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400, f"token id {bad} in '{name}' is outside the vocabulary [0, {n_vocab})", name
        )
    return list(value)


class Fields:
    """Typed access to a request object's fields; unknown fields are ignored.

    With ``declared`` (a table of :mod:`tessera.plugins.server.api_fields` or a sibling),
    every declared field is checked on construction (a 400 naming the first bad one), and
    ``f[name]`` reads one with its declared type, range and default; reading a field the
    table does not declare is a programming error (KeyError), so the table stays complete.
    """

    def __init__(self, body: dict[str, Any], declared: Mapping[str, Field] | None = None) -> None:
        self.body = body
        self.declared = declared or {}
        for name in self.declared:  # every declared field is checked now, before any work
            self[name]

    def __getitem__(self, name: str) -> Any:
        field = self.declared[name]
        if field.required:
            self.required(name)
        if field.kind == "integer":
            return self.integer(name, field.default, *self._range(field))
        if field.kind == "number":
            return self.number(name, field.default, *self._range(field))
        if field.kind == "boolean":
            return self.boolean(name, field.default)
        if field.kind == "strings":
            return self.string_list(name)
        if field.kind == "object":
            return self.obj(name)
        value = self.get(name, field.default)
        if field.kind == "string" and value is not None and not isinstance(value, str):
            raise self._bad(name, "a string")
        # None only where the default is None: the field is optional and was not given
        if field.kind == "choice" and value is not None and value not in field.choices:
            raise self._bad(name, "one of " + ", ".join(field.choices))
        return value

    @staticmethod
    def _range(field: Field) -> tuple[Any, Any]:
        # the sampler's own validator words its ranges (the CLI shares it), so they are
        # left to it; open bounds too
        if field.sampler or field.lo_open:
            return None, None
        return field.lo, field.hi

    def _bad(self, name: str, want: str) -> ApiError:
        shown = repr(self.body.get(name))
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return ApiError(400, f"'{name}' must be {want}, got {shown}", param=name)

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
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or (lo is not None and value < lo)
            or (hi is not None and value > hi)
        ):
            raise self._bad(name, "an integer" + _span(lo, hi))
        return value

    def number(
        self, name: str, default: float | None, lo: float | None = None, hi: float | None = None
    ) -> float | None:
        """A finite number: Python's JSON parser reads NaN and Infinity, which no field takes."""
        value = self.get(name, default)
        if value is None:
            return None
        want = "a finite number" + _span(lo, hi)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(name, want)
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            raise self._bad(name, want) from None
        if not math.isfinite(number):
            raise self._bad(name, want)
        if (lo is not None and number < lo) or (hi is not None and number > hi):
            raise self._bad(name, want)
        return number

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

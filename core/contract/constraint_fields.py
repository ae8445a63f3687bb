"""How a caller's fields name an output constraint, read once for every caller.

:class:`tessera.LLM`'s keywords and the server's request fields (OpenAI's
``response_format``, GBNF ``grammar``, vLLM's ``guided_*`` ...) each name a constraint kind
of the runtime's catalogue and its spec. :func:`response_format_constraint` reads OpenAI's
field, :func:`compile_constraint` checks that at most one field asks and compiles it. A
field that cannot be honoured is a :class:`ConstraintFieldError` naming the field, which
the Python API raises as it is and the server answers as a 400 with ``param`` set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessera.contract.constraints import Constraint, ConstraintSpecError
from tessera.errors import TesseraError, UnknownNameError

#: One field's ask: (field name, constraint kind, spec).
Asked = tuple[str, str, Any]


class ConstraintFieldError(TesseraError, ValueError):
    """An output-constraint field that cannot be honoured; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def response_format_constraint(fmt: Any) -> tuple[str, Any] | None:
    """(kind, spec) of OpenAI's ``response_format`` (also llama-server's and
    llama-cpp-python's ``{"type": "json_object", "schema": {...}}``); None for text."""
    if fmt is None:
        return None

    def refuse(message: str) -> ConstraintFieldError:
        return ConstraintFieldError("response_format", message)

    if not isinstance(fmt, Mapping):
        raise refuse(
            f"response_format must be an object such as {{'type': 'json_object'}}, got {fmt!r}"
        )
    for key in ("json_schema", "schema"):
        if key in fmt and not isinstance(fmt[key], Mapping):
            raise refuse(f"response_format {key} must be an object")
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        # llama-server's form: a json_object with a schema is that schema
        schema = fmt.get("schema")
        return ("json_object", None) if schema is None else ("json_schema", schema)
    if kind == "json_schema":
        wrapper = fmt.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, Mapping) else fmt.get("schema")
        if schema is None:
            raise refuse(
                "response_format json_schema needs the schema: "
                '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}'
            )
        return "json_schema", schema
    raise refuse(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema"
    )


def compile_constraint(
    runtime: Any, asked: Sequence[Asked], tokenizer: Any
) -> Callable[[], Constraint] | None:
    """The per-generation constraint factory of the one field in ``asked`` (None when none
    asks), compiled by its kind in ``runtime``'s catalogue for ``tokenizer``. More than one
    field, a kind no plugin registers or a spec the kind refuses is a
    :class:`ConstraintFieldError` (the second field, or the one refused). The first compile
    for a vocabulary may take seconds: callers on an event loop run this in a thread."""
    if not asked:
        return None
    if len(asked) > 1:
        names = " and ".join(f"'{a[0]}'" for a in asked)
        raise ConstraintFieldError(
            asked[1][0], f"give one output constraint; this request has {names}"
        )
    field, kind, spec = asked[0]
    try:
        info = runtime.constraint_kind(kind)
    except UnknownNameError as exc:
        raise ConstraintFieldError(field, f"{field} cannot be enforced: {exc}") from None
    try:
        return info.compile(spec, tokenizer)
    except ConstraintSpecError as exc:
        raise ConstraintFieldError(field, f"{field} is refused: {exc}") from None

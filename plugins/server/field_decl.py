"""The declaration of one request field (:class:`Field`: type, range, default, meaning),
and the helpers and JSON schemas the declarations of every API share.

:class:`tessera.plugins.server.fields.Fields` checks a request against these
declarations; :mod:`tessera.plugins.server.openapi` turns them into ``/openapi.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.engine.sampling import SamplerParams

SAMPLER = SamplerParams()


@attrs.frozen
class Field:
    """One request field.

    ``kind`` is one of ``integer``, ``number`` (finite), ``boolean``, ``string``,
    ``strings`` (a string or a list of strings), ``object``, ``choice`` (one of
    ``choices``) or ``any`` (checked by its handler; ``schema`` says which forms it takes).
    ``lo``/``hi`` bound numbers (``lo_open``: strictly above ``lo``).
    """

    name: str
    kind: str
    doc: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False
    #: The range is :class:`SamplerParams`' own, checked (and worded) there.
    sampler: bool = False
    schema: Mapping[str, Any] | None = None

    def json_schema(self) -> dict[str, Any]:
        """This field's JSON schema (OpenAPI 3.1)."""
        if self.schema is not None:
            out = dict(self.schema)
        elif self.kind == "strings":
            out = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        elif self.kind == "choice":
            out = {"type": "string", "enum": list(self.choices)}
        else:
            out = {"type": self.kind}
        if self.lo is not None:
            out["exclusiveMinimum" if self.lo_open else "minimum"] = self.lo
        if self.hi is not None:
            out["maximum"] = self.hi
        if self.default is not None:
            out["default"] = self.default
        # null is accepted for every optional field: it means "not given", as in OpenAI's API
        if not self.required:
            out = {"anyOf": [out, {"type": "null"}]} if "type" in out else nullable(out)
        return {**out, "description": self.doc}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (an ``anyOf``) that also takes null."""
    return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}


def group(*fields: Field) -> dict[str, Field]:
    """The fields of one route (or a part of several routes') by name."""
    return {f.name: f for f in fields}


#: Schemas several APIs' fields share: a prompt (text, token ids, or a list of either), a
#: chat message, a list of strings.
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_TEXT_OR_IDS = {"anyOf": [{"type": "string"}, _TOKEN_IDS]}
PROMPT = {
    "anyOf": [*_TEXT_OR_IDS["anyOf"], {"type": "array", "items": _TEXT_OR_IDS, "minItems": 1}]
}
MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        # an array of parts: text parts are joined; image and audio parts are refused
        "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
            "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}]},
    },
}  # fmt: skip


def sampler(
    name: str, kind: str, doc: str, lo: float | None, hi: float | None = None, **kw: Any
) -> Field:
    """A field of :class:`SamplerParams`, with its default."""
    return Field(name, kind, doc, getattr(SAMPLER, name), lo, hi, sampler=True, **kw)


STRING_LIST = {"type": "array", "items": {"type": "string"}}

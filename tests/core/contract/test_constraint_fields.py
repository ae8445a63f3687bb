"""response_format_constraint maps every form of OpenAI's field (and llama-server's) to the
constraint kind and spec, and refuses the others naming the field; compile_constraint
takes one field, compiles it with its kind and names the field it refuses."""

from __future__ import annotations

import pytest

from tessera.contract.constraint_fields import (
    ConstraintFieldError,
    compile_constraint,
    response_format_constraint,
)
from tessera.contract.constraints import ConstraintKind, ConstraintSpecError
from tessera.errors import UnknownNameError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        (None, None),
        ({}, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, ("json_object", None)),
        ({"type": "json_object", "schema": SCHEMA}, ("json_schema", SCHEMA)),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
            ("json_schema", SCHEMA),
        ),
        ({"type": "json_schema", "schema": SCHEMA}, ("json_schema", SCHEMA)),
    ],
)
def test_each_form_names_its_kind_and_spec(fmt, expected):
    assert response_format_constraint(fmt) == expected


@pytest.mark.parametrize(
    ("fmt", "words"),
    [
        ({"type": "xml"}, "response_format type 'xml' is not supported"),
        ("json", "must be an object"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs the schema"),
        ({"type": "json_schema", "json_schema": "x"}, "json_schema must be an object"),
        ({"type": "json_object", "schema": [1]}, "schema must be an object"),
    ],
)
def test_a_form_it_cannot_enforce_names_the_field(fmt, words):
    with pytest.raises(ConstraintFieldError, match=words) as info:
        response_format_constraint(fmt)
    assert info.value.field == "response_format"
    assert isinstance(info.value, ValueError)


class _Runtime:
    """A catalogue of one kind, ``upper``, whose compile refuses lower-case specs."""

    def constraint_kind(self, name):
        if name != "upper":
            raise UnknownNameError(f"no constraint kind {name!r}; installed: upper")

        def compile_spec(spec, tokenizer):
            if spec != spec.upper():
                raise ConstraintSpecError(f"{spec!r} is not upper case")
            return lambda: (spec, tokenizer)

        return ConstraintKind("upper", compile_spec)


def test_one_field_compiles_with_its_kind():
    factory = compile_constraint(_Runtime(), [("grammar", "upper", "AB")], "tok")
    assert factory() == ("AB", "tok")
    assert compile_constraint(_Runtime(), [], "tok") is None


@pytest.mark.parametrize(
    ("asked", "field", "words"),
    [
        ([("grammar", "upper", "A"), ("guided_regex", "upper", "B")], "guided_regex", "one output"),
        ([("guided_regex", "regex", "a")], "guided_regex", "guided_regex cannot be enforced"),
        ([("grammar", "upper", "ab")], "grammar", "grammar is refused: 'ab' is not upper case"),
    ],
)
def test_a_refusal_names_the_field(asked, field, words):
    with pytest.raises(ConstraintFieldError, match=words) as info:
        compile_constraint(_Runtime(), asked, "tok")
    assert info.value.field == field

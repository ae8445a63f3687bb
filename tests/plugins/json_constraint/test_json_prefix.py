"""The incremental JSON validator against Python's json module as the oracle."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import TesseraError
from tessera.plugins.json_constraint.prefix import JsonPrefix

WHITESPACE = (b" ", b"\t", b"\n", b"\r")
UNBOUNDED = 1_000_000  # whitespace bound out of the way for json.dumps(indent=...) output

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
objects = st.dictionaries(st.text(max_size=6), values, max_size=5)
layouts = st.sampled_from(
    [
        {},
        {"separators": (",", ":")},
        {"indent": 2},
        {"indent": "\t", "separators": (",", " : ")},
        {"ensure_ascii": False},
        {"ensure_ascii": False, "indent": 1},
    ]
)
# Bytes a mutation may insert: JSON punctuation, digits, escapes, UTF-8 lead and stray bytes.
MUTATION_BYTES = (
    b'{}[]":,\\-+.eE0159 \t\nuatfnlrs\x00\x1f\x7f\x80\xa0\xbf\xc0\xc3\xe0\xed\xf0\xf4\xff'
)
# (position, insert / replace / delete, byte) edits applied to a dumped document
edits = st.tuples(st.integers(0, 10**6), st.integers(0, 2), st.sampled_from(MUTATION_BYTES))
edit_lists = st.lists(edits, min_size=1, max_size=3)


def scan(data: bytes, max_ws_run: int = UNBOUNDED) -> tuple[int | None, bool]:
    """(index of the first rejected byte or None, whether the document is complete)."""
    state = JsonPrefix(max_ws_run)
    for i, b in enumerate(data):
        if not state.step(b):
            return i, False
    return None, state.complete


def oracle(data: bytes) -> bool:
    """Whether ``data`` is a whole document the validator must accept (json.loads agrees)."""
    if data[:1] in WHITESPACE or data[-1:] in WHITESPACE:
        return False  # the document is the object itself, from its { to its }

    def no_constants(name):
        raise ValueError(name)

    try:
        value = json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(value, dict)


def complete_greedily(state: JsonPrefix) -> bytes:
    """Some bytes that close the document, chosen by the validator (a prefix it called
    valid must have such a completion that json.loads accepts)."""
    order = b'"}]:0{' + bytes(range(256))
    out = bytearray()
    while not state.complete:
        assert len(out) < 10_000
        b = next(b for b in order if state.accepts(bytes([b])))
        state.step(b)
        out.append(b)
    return bytes(out)


@settings(max_examples=200, deadline=None)
@given(objects, layouts)
def test_every_prefix_of_a_dumped_object_is_valid_and_complete_only_at_the_end(obj, layout):
    data = json.dumps(obj, **layout).encode()
    state = JsonPrefix(UNBOUNDED)
    for i, b in enumerate(data):
        assert not state.complete, f"complete before byte {i} of {data!r}"
        assert state.step(b), f"byte {i} of {data!r} rejected"
    assert state.complete


@settings(max_examples=400, deadline=None)
@given(objects, layouts, edit_lists)
def test_mutated_documents_are_accepted_exactly_when_json_loads_accepts(obj, layout, edits):
    data = bytearray(json.dumps(obj, **layout).encode())
    for pos, kind, b in edits:
        pos %= len(data) + 1
        if kind == 0:
            data.insert(pos, b)
        elif kind == 1 and pos < len(data):
            data[pos] = b
        elif pos < len(data):
            del data[pos]
    data = bytes(data)
    bad, complete = scan(data)
    assert (bad is None and complete) == oracle(data), data
    # Whatever the validator let through is a true prefix: it can be completed into a
    # document json.loads accepts.
    valid_prefix = data if bad is None else data[:bad]
    state = JsonPrefix(UNBOUNDED)
    assert state.feed(valid_prefix)
    assert oracle(valid_prefix + complete_greedily(state)), valid_prefix


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 01}',
        '{"a": -}',
        '{"a": 1.}',
        '{"a": 1e}',
        '{"a": .5}',
        '{"a": +1}',
        '{"a": tru}',
        '{"a": "\\x"}',
        '{"a": "\\u12g4"}',
        '{"a" 1}',
        '{"a": 1,}',
        "{'a': 1}",
        '{"a": [1,]}',
        '{"a": [1}',
        "[1, 2]",
        '"text"',
        "{}}",
        "{} ",
        '{"a": NaN}',
    ],
)
def test_invalid_documents_are_rejected(text):
    bad, complete = scan(text.encode())
    assert bad is not None or not complete
    assert not oracle(text.encode())


@pytest.mark.parametrize(
    "data",
    [b'{"\xc0\x80": 1}', b'{"\xed\xa0\x80": 1}', b'{"\xf4\x90\x80\x80": 1}', b'{"\xc3": 1}'],
    ids=["overlong", "surrogate", "above-max", "truncated"],
)
def test_invalid_utf8_in_strings_is_rejected(data):
    assert scan(data)[0] is not None
    assert not oracle(data)


def test_a_character_split_across_feeds_is_accepted():
    state = JsonPrefix()
    assert state.feed(b'{"caf\xc3')
    assert state.feed(b'\xa9": "\xf0\x9f')
    assert state.feed(b'\x98\x80"}')
    assert state.complete


def test_whitespace_runs_are_bounded():
    assert scan(b"{" + b" " * 16 + b"}", max_ws_run=16) == (None, True)
    assert scan(b"{" + b" " * 17 + b"}", max_ws_run=16)[0] == 17
    # the count restarts after any other byte
    assert scan(b'{ \n \n"a" \n\t\r:  1  }', max_ws_run=4) == (None, True)
    assert scan(b"{}", max_ws_run=0) == (None, True)
    assert scan(b"{ }", max_ws_run=0)[0] == 1


def test_nothing_comes_before_the_object():
    assert scan(b' {"a": 1}')[0] == 0
    assert scan(b'\n{"a": 1}')[0] == 0


def test_nothing_follows_the_complete_object():
    state = JsonPrefix()
    assert state.feed(b'{"a": [1, {"b": null}]}')
    assert state.complete
    assert not state.accepts(b" ")
    assert not state.accepts(b"{")


def test_accepts_leaves_the_state_unchanged():
    state = JsonPrefix()
    state.feed(b'{"a": ')
    assert state.accepts(b"[1]}")
    assert not state.accepts(b"}")
    assert state.feed(b"true}")


def test_negative_whitespace_bound_is_refused():
    with pytest.raises(TesseraError, match="max_ws_run"):
        JsonPrefix(-1)

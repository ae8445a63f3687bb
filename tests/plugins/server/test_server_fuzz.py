"""Property-based fuzzing of the server: random values and types for every field
/openapi.json documents on the generating, embedding, tokenizing and slot routes, and
bodies that are truncated, repeated or carry a key twice. Every answer is a 2xx, or a 4xx
in OpenAI's error shape; never a 5xx; and after each example a normal greedy request
still gets the answer it got before the fuzzing began."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.plugins.server.testing import live_server

# Values of every JSON type, including the hostile ones Python's parser accepts.
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63), 0.5, 1e308, -1e-308]),
)
HOSTILE_TEXT = st.sampled_from(["", "\x00", "../../etc/passwd", "é" * 300, "\ud800", "{"])
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20), HOSTILE_TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
#: Plausible values per field, so that many examples get past validation and reach the
#: engine (the hostile VALUES test the refusals).
PLAUSIBLE = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "min_p": st.floats(0, 1),
    "typical_p": st.floats(0, 1),
    "top_k": st.integers(0, 100),
    "top_n_sigma": st.floats(-1, 5),
    "repeat_penalty": st.floats(0.5, 2),
    "repeat_last_n": st.integers(0, 64),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "dry_multiplier": st.floats(0, 2),
    "dry_base": st.floats(1, 3),
    "dry_allowed_length": st.integers(1, 4),
    "xtc_probability": st.floats(0, 1),
    "xtc_threshold": st.floats(0, 1),
    "seed": st.integers(-1, 2**32),
    "max_tokens": st.integers(1, 6),
    "max_completion_tokens": st.integers(1, 6),
    "n_predict": st.integers(1, 6),
    "n": st.integers(1, 3),
    "n_probs": st.integers(0, 5),
    "logprobs": st.one_of(st.booleans(), st.integers(0, 5)),
    "top_logprobs": st.integers(0, 5),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1), max_size=2)),
    "stream": st.booleans(),
    "echo": st.booleans(),
    "ignore_eos": st.booleans(),
    "cache_prompt": st.booleans(),
    "id_slot": st.integers(-1, 3),
    "logit_bias": st.dictionaries(st.integers(0, 600).map(str), st.floats(-100, 100), max_size=3),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "encoding_format": st.sampled_from(["float", "base64"]),
    "dimensions": st.integers(1, 64),
    "add_special": st.booleans(),
    "parse_special": st.booleans(),
    "with_pieces": st.booleans(),
    "filename": st.sampled_from(["fuzz.bin", "missing.bin", "a b.bin"]),
}
#: The fuzzed routes: their required field and good values for it.
ROUTES = {
    "/v1/completions": ("prompt", ["Once upon a time", [1, 2, 3]]),
    "/completion": ("prompt", ["Once upon a time", [1, 2, 3]]),
    "/v1/chat/completions": ("messages", [[{"role": "user", "content": "hi"}]]),
    "/v1/embeddings": ("input", ["hello", ["a", "b"]]),
    "/tokenize": ("content", ["hello world"]),
    "/detokenize": ("tokens", [[1, 2, 3]]),
    "/slots/{id_slot}": ("filename", ["fuzz.bin"]),
}
#: The normal request made after each example, and what it must answer.
CHECK = {"prompt": "Once", "max_tokens": 3, "temperature": 0, "cache_prompt": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server whose answers stop after 4 tokens, so a hostile max_tokens stays quick."""
    argv = ["--backend", "numpy", "-np", "3", "-c", "512", "-b", "64", "--max-queue", "8"]
    argv += ["--slot-save-path", str(tmp_path_factory.mktemp("slots")), "--pooling", "mean"]
    with live_server([*argv, "--max-tokens-cap", "4"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def documented(server) -> dict[str, tuple[list[str], bool]]:
    """Route -> the request fields /openapi.json documents for it (its query parameters
    included), so a field added to the API is fuzzed without touching this test, and
    whether its errors may take llama-server's shape (the route documents both)."""
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=30) as r:
        paths = json.loads(r.read())["paths"]
    routes = {}
    for path, (key, _) in ROUTES.items():
        op = paths[path]["post"]
        body = op["requestBody"]["content"]["application/json"]["schema"]
        params = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]
        fields = sorted({*body.get("properties", {}), *params} - {"model"})
        assert key in fields, (path, fields)
        error = op["responses"]["4XX"]["content"]["application/json"]["schema"]
        routes[path] = fields, "anyOf" in error
    return routes


@pytest.fixture(scope="module")
def expected(server) -> str:
    status, reply = _post(server.v1 + "/completions", json.dumps(CHECK).encode())
    assert status == 200, reply
    return json.loads(reply)["choices"][0]["text"]


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _check_reply(status: int, raw: bytes, native: bool = False) -> None:
    """A 2xx, or a 4xx with OpenAI's error object (``code`` a string or null); on
    llama-server's native routes also its own object, whose ``code`` is the status."""
    assert status < 500, raw[:500]
    if status >= 400:
        error = json.loads(raw)["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str), error
        if native and isinstance(error["code"], int):
            assert error["code"] == status, error
        else:
            assert "param" in error, error
            assert error["code"] is None or isinstance(error["code"], str), error


def _still_serves(server, expected: str) -> None:
    status, reply = _post(server.v1 + "/completions", json.dumps(CHECK).encode())
    assert status == 200, reply
    assert json.loads(reply)["choices"][0]["text"] == expected


@st.composite
def requests(draw, documented: dict[str, tuple[list[str], bool]]):
    """A route and a plausible request for it (random valid values for some fields), then
    up to two fields (the required one included) replaced by hostile values of any type;
    the slot route's id and action are fields as well."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    key, good = ROUTES[path]
    fields, _ = documented[path]
    body = {key: draw(st.sampled_from(good))}
    if path.startswith("/slots"):
        body |= {"id_slot": draw(st.integers(-1, 3)), "action": draw(
            st.sampled_from(["save", "restore", "erase"]))}  # fmt: skip
    for name in fields:
        if name in PLAUSIBLE and draw(st.booleans()):
            body[name] = draw(PLAUSIBLE[name])
    for name in draw(st.lists(st.sampled_from(fields), max_size=2, unique=True)):
        body[name] = draw(VALUES)
    if path.endswith("completions") and not any(k in body for k in ("max_tokens", "n_predict")):
        body["max_tokens"] = 4  # keep each example short
    return path, body


def _url(server, path: str, body: dict) -> str:
    """The slot route takes its id in the path and its action in the query."""
    if not path.startswith("/slots"):
        return server.url + path
    id_slot = urllib.parse.quote(str(body.pop("id_slot", 0)), safe="")
    action = urllib.parse.quote(str(body.pop("action", "")), safe="")
    return f"{server.url}/slots/{id_slot}?action={action}"


@st.composite
def mangled(draw, raw: bytes):
    """The body as sent, or cut short, or sent twice, or with one key written twice."""
    how = draw(st.sampled_from(["as is", "cut", "twice", "key twice"]))
    if how == "cut" and len(raw) > 1:
        return raw[: draw(st.integers(1, len(raw) - 1))]
    if how == "twice":
        return raw + raw
    if how == "key twice" and raw.startswith(b"{") and len(raw) > 2:
        return (
            b'{"max_tokens": ' + json.dumps(draw(VALUES), allow_nan=True).encode() + b", " + raw[1:]
        )
    return raw


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_fields_never_break_the_server(server, documented, expected, data):
    path, body = data.draw(requests(documented))
    url = _url(server, path, body)
    raw = data.draw(mangled(json.dumps(body, allow_nan=True).encode()))
    status, reply = _post(url, raw)
    _check_reply(status, reply, native=documented[path][1])
    _still_serves(server, expected)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
def test_random_bytes_as_a_body_are_a_clean_400(server, expected, raw):
    status, reply = _post(server.v1 + "/chat/completions", raw)
    _check_reply(status, reply)
    assert status == 400 or status < 300, reply[:300]
    _still_serves(server, expected)

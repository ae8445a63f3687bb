"""Property-based fuzzing of the server: random values and types for the documented fields
of every generating, embedding and tokenizing route. Every answer is a 2xx, or a 4xx in
OpenAI's error shape; never a 5xx; and after each example a normal request still works."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Values of every JSON type, including the hostile ones Python's parser accepts.
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, -(2**63), 0.5, 1e308, -1e-308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
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
    "top_k": st.integers(0, 100),
    "repeat_penalty": st.floats(0.5, 2),
    "seed": st.integers(-1, 2**32),
    "max_tokens": st.integers(1, 6),
    "max_completion_tokens": st.integers(1, 6),
    "n_predict": st.integers(1, 6),
    "n": st.integers(1, 3),
    "logprobs": st.one_of(st.booleans(), st.integers(0, 5)),
    "top_logprobs": st.integers(0, 5),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1), max_size=2)),
    "stream": st.booleans(),
    "ignore_eos": st.booleans(),
    "cache_prompt": st.booleans(),
    "id_slot": st.integers(-1, 3),
    "logit_bias": st.dictionaries(st.integers(0, 600).map(str), st.floats(-100, 100), max_size=3),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
    "encoding_format": st.sampled_from(["float", "base64"]),
    "add_special": st.booleans(),
    "with_pieces": st.booleans(),
}
SAMPLING = [
    "temperature", "top_p", "min_p", "top_k", "repeat_penalty", "seed", "max_tokens",
    "max_completion_tokens", "n", "logprobs", "top_logprobs", "stop", "stream", "logit_bias",
    "ignore_eos", "id_slot", "cache_prompt", "response_format", "n_predict",
]  # fmt: skip
ROUTES = {
    "/v1/completions": ("prompt", ["Once upon a time", [1, 2, 3]], SAMPLING),
    "/v1/chat/completions": (
        "messages",
        [[{"role": "user", "content": "hi"}]],
        [*SAMPLING, "tools", "tool_choice", "chat_template_kwargs"],
    ),
    "/v1/embeddings": ("input", ["hello", ["a", "b"]], ["encoding_format", "dimensions"]),
    "/tokenize": ("content", ["hello world"], ["add_special", "with_pieces"]),
    "/detokenize": ("tokens", [[1, 2, 3]], []),
}


@st.composite
def requests(draw):
    """A plausible request (random valid values for some fields), then up to two fields
    (the main one included) replaced by hostile values of any type."""
    path = draw(st.sampled_from(sorted(ROUTES)))
    key, good, fields = ROUTES[path]
    body = {key: draw(st.sampled_from(good))}
    for name in fields:
        if name in PLAUSIBLE and draw(st.booleans()):
            body[name] = draw(PLAUSIBLE[name])
    for name in draw(st.lists(st.sampled_from([key, *fields]), max_size=2, unique=True)):
        body[name] = draw(VALUES)
    if path.endswith("completions") and not any(k in body for k in ("max_tokens", "n_predict")):
        body["max_tokens"] = 4  # keep each example short
    return path, body


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _check_reply(status: int, raw: bytes) -> None:
    assert status < 500, raw[:500]
    if status >= 400:
        error = json.loads(raw)["error"]
        assert {"message", "type", "param", "code"} <= set(error), error
        assert isinstance(error["message"], str) and error["message"]
        assert error["code"] is None or isinstance(error["code"], str)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=requests())
def test_random_fields_never_break_the_server(server, request):
    path, body = request
    raw = json.dumps(body, allow_nan=True).encode()
    status, reply = _post(server.url + path, raw)
    _check_reply(status, reply)
    ok, answer = _post(
        server.v1 + "/completions",
        json.dumps({"prompt": "Once", "max_tokens": 2, "temperature": 0}).encode(),
    )
    assert ok == 200, answer


@settings(max_examples=40, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode)))
def test_random_bytes_as_a_body_are_a_clean_400(server, raw):
    status, reply = _post(server.v1 + "/chat/completions", raw)
    _check_reply(status, reply)

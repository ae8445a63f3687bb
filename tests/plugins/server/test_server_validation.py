"""Sampling and generation fields are checked before the engine sees them: a bad value is a
400 naming the field, the value and the range, and the server keeps serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 2}
ROUTES = {"/completions": COMPLETION, "/chat/completions": CHAT}


def _request(url: str, body: bytes | None, method: str = "POST") -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _post_raw(server, route: str, extra: str) -> tuple[int, dict]:
    """POST the route's base body with ``extra`` spliced in as raw JSON text (so that
    NaN and Infinity, which Python's parser reads, can be sent)."""
    base = json.dumps(ROUTES[route])
    return _request(server.v1 + route, (base[:-1] + ", " + extra + "}").encode())


def _assert_ok_after(server, route: str) -> None:
    status, body = _request(server.v1 + route, json.dumps(ROUTES[route]).encode())
    assert status == 200, body
    assert body["choices"]


def _assert_400(status: int, body: dict, param: str, *words: str) -> None:
    assert status == 400, body
    error = body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] is None or isinstance(error["code"], str)
    assert param in error["message"]
    for w in words:
        assert w in error["message"], error["message"]


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "repeat_penalty"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_400_with_param_and_the_server_keeps_serving(
    server, route, field, value
):
    status, body = _post_raw(server, route, f'"{field}": {value}')
    _assert_400(status, body, field, "finite number")
    _assert_ok_after(server, route)


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ('"repeat_penalty": 0', "repeat_penalty", ["> 0", "got 0"]),
        ('"repeat_penalty": -1.5', "repeat_penalty", ["> 0"]),
        ('"temperature": 2.5', "temperature", ["between 0 and 2", "2.5"]),
        ('"top_p": 1.5', "top_p", ["between 0 and 1", "1.5"]),
        ('"min_p": -0.1', "min_p", ["between 0 and 1"]),
        ('"top_k": 2.5', "top_k", ["integer"]),
        ('"repeat_last_n": -2', "repeat_last_n", [">= -1"]),
        ('"seed": -2', "seed", ["-1 for a random seed", "got -2"]),
        ('"seed": 18446744073709551616', "seed", ["2**64 - 1"]),
        ('"seed": 1.5', "seed", ["integer"]),
        ('"n": 0', "n", ["between 1 and 16"]),
        ('"max_tokens": 0', "max_tokens", [">= 1"]),
        ('"n_predict": -2', "n_predict", [">= -1"]),
        ('"id_slot": 99', "id_slot", ["between -1 and 2"]),
        ('"logit_bias": {"1": NaN}', "logit_bias", ["finite numbers"]),
        ('"temperature": 1e400', "temperature", ["finite number"]),
    ],
)
def test_out_of_range_sampling_fields_are_400_naming_field_and_range(
    server, route, extra, param, words
):
    status, body = _post_raw(server, route, extra)
    _assert_400(status, body, param, *words)
    _assert_ok_after(server, route)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ('"logprobs": 21', "logprobs"),
        ('"prompt": [1, -5]', "prompt"),
        ('"prompt": [1e9]', "prompt"),
    ],
)
def test_completion_only_fields_are_checked(server, extra, param):
    status, body = _post_raw(server, "/completions", extra)
    assert status == 400, body
    assert body["error"]["param"] == param
    _assert_ok_after(server, "/completions")


def test_a_token_id_outside_the_vocabulary_is_400(server):
    n_vocab = server.model.tokenizer.n_vocab
    status, body = _post_raw(server, "/completions", f'"prompt": [1, {n_vocab}]')
    _assert_400(status, body, "prompt", f"token id {n_vocab}", f"[0, {n_vocab})")
    status, body = _request(
        server.v1 + "/embeddings", json.dumps({"input": [[n_vocab + 3]]}).encode()
    )
    _assert_400(status, body, "input", "outside the vocabulary")


def test_a_huge_integer_logit_bias_is_clamped_not_an_error(server):
    status, body = _post_raw(server, "/completions", '"logit_bias": {"1": ' + "9" * 400 + "}")
    assert status == 200, body


def test_chat_top_logprobs_range(server):
    status, body = _post_raw(server, "/chat/completions", '"logprobs": true, "top_logprobs": 21')
    _assert_400(status, body, "top_logprobs", "between 0 and 20")


@pytest.mark.parametrize("route", list(ROUTES))
def test_seed_minus_one_is_a_random_seed(server, route):
    # llama.cpp's "seed": -1; at temperature 1 over the whole vocabulary, three 24-token
    # draws from fresh random seeds all being equal is next to impossible
    kw = {"max_tokens": 24, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    texts = []
    for _ in range(3):
        status, body = _request(
            server.v1 + route, json.dumps({**ROUTES[route], **kw, "seed": -1}).encode()
        )
        assert status == 200, body
        choice = body["choices"][0]
        texts.append(choice["text"] if "text" in choice else choice["message"]["content"])
    assert len(set(texts)) > 1, texts


def test_seed_minus_one_with_n_choices_gives_distinct_draws(client):
    r = client.completions.create(
        model="m", prompt="Once", max_tokens=24, temperature=1.0, n=3, seed=-1,
        extra_body={"top_k": 0, "top_p": 1.0, "min_p": 0.0},
    )  # fmt: skip
    assert len({c.text for c in r.choices}) > 1


def test_the_openai_client_sees_a_string_or_null_code_and_the_param(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model="m", prompt="Hi", max_tokens=1, extra_body={"repeat_penalty": 0}
        )
    assert err.value.code is None
    assert err.value.param == "repeat_penalty"
    assert "repeat_penalty must be a finite number > 0" in err.value.message
    assert client.completions.create(model="m", prompt="Hi", max_tokens=1, seed=-1).choices


def test_405_is_an_invalid_request_error_with_a_null_code(server):
    status, body = _request(server.v1 + "/completions", None, method="GET")
    assert status == 405, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] is None
    assert "GET is not allowed" in body["error"]["message"]


def test_404_and_400_codes_are_strings_or_null(server):
    status, body = _request(server.url + "/v1/nothing-here", b"{}")
    assert status == 404 and body["error"]["code"] is None
    status, body = _request(server.v1 + "/completions", b"{not json")
    assert status == 400 and body["error"]["code"] is None


def test_a_body_with_a_5000_digit_number_is_400_not_500(server):
    status, body = _request(
        server.v1 + "/completions", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"
    )
    assert status == 400, body
    assert "not valid JSON" in body["error"]["message"]

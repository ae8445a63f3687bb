"""Structured output through the HTTP layer, read by the official clients: every output
constraint field keeps the (nonsense-writing) default model's text inside its language,
checked by an independent oracle (jsonschema, Python's re, json)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import jsonschema
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Answer in the asked format."}]
# bounded, so that every sample ends within max_tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green"]},
    },
    "required": ["n", "ok", "tag"],
    "additionalProperties": False,
}
GBNF = 'root ::= "(" word ("," word)* ")"\nword ::= [a-z] [a-z]? [a-z]?'
GBNF_REGEX = re.compile(r"\([a-z]{1,3}(,[a-z]{1,3})*\)")


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(client, seed: int, max_tokens: int = 300, **kw):
    return client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=max_tokens, temperature=1.0, seed=seed, **kw
    )


def test_json_schema_response_format_output_validates(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        r = chat(client, seed, response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_response_format_gives_an_object(client):
    for seed in range(3):
        r = chat(client, seed, max_tokens=200, response_format={"type": "json_object"})
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert text.lstrip().startswith("{")


def test_gbnf_grammar_output_matches_the_grammar(client, server):
    for seed in range(3):
        r = chat(client, seed, extra_body={"grammar": GBNF})
        assert r.choices[0].finish_reason == "stop"
        assert GBNF_REGEX.fullmatch(r.choices[0].message.content)
    legacy = client.completions.create(
        model="m", prompt="x", max_tokens=200, seed=1, extra_body={"guided_grammar": GBNF}
    )
    assert GBNF_REGEX.fullmatch(legacy.choices[0].text)
    status, body = post(server.url + "/completion", {"prompt": "x", "grammar": GBNF, "seed": 2})
    assert status == 200 and GBNF_REGEX.fullmatch(body["content"])


def test_gbnf_token_references_pick_the_tokens(server):
    """llama.cpp's <[ID]>: the generated tokens are those ids (return_tokens shows them)."""
    grammar = 'root ::= <[42]> <[42]> !<[42]> "."'
    body = {"prompt": "x", "grammar": grammar, "seed": 3, "return_tokens": True}
    status, r = post(server.url + "/completion", body)
    assert status == 200, r
    assert r["tokens"][:2] == [42, 42] and r["tokens"][2] != 42
    assert r["content"].endswith(".")


def test_llama_server_json_schema_on_completion(server):
    for seed in range(2):
        status, body = post(
            server.url + "/completion", {"prompt": "x", "json_schema": SCHEMA, "seed": seed}
        )
        assert status == 200 and body["stop_type"] == "eos"
        jsonschema.validate(json.loads(body["content"]), SCHEMA)


def test_guided_choice_returns_one_of_the_choices(client):
    choices = ["alpha", "beta", "gamma delta"]
    seen = set()
    for seed in range(6):
        r = chat(client, seed, extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices
        seen.add(r.choices[0].message.content)
    assert len(seen) > 1  # sampled, not a fixed answer


def test_guided_regex_output_matches(client):
    pattern = r"[0-9]{3}-[a-f]{2,4}"
    for seed in range(3):
        r = chat(client, seed, extra_body={"guided_regex": pattern})
        assert re.fullmatch(pattern, r.choices[0].message.content)


def test_guided_json_schema_as_text(client):
    r = chat(client, 0, extra_body={"guided_json": json.dumps(SCHEMA)})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


@pytest.mark.parametrize(
    "extra, field, words",
    [
        ({"grammar": 'root ::= "a" missing'}, "grammar", ["missing"]),
        ({"guided_regex": "a(b"}, "guided_regex", ["unclosed group"]),
        ({"guided_json": {"type": "objectx"}}, "guided_json", ["objectx"]),
        ({"guided_choice": []}, "guided_choice", ["non-empty list"]),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
            ["needs the schema"],
        ),
        ({"grammar": "root ::= [a-z]", "guided_regex": "a"}, "guided_regex", ["one output"]),
    ],
)
def test_invalid_constraints_are_400_naming_the_error(client, extra, field, words):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, 0, extra_body=extra)
    error = err.value.body
    assert err.value.status_code == 400 and error["param"] == field
    assert all(w in error["message"] for w in words), error["message"]


def test_ollama_format_schema(server):
    import ollama

    client = ollama.Client(host=server.url)
    for seed in range(2):
        r = client.chat(
            model="m", messages=MESSAGES, format=SCHEMA, options={"seed": seed, "num_predict": 300}
        )
        jsonschema.validate(json.loads(r.message.content), SCHEMA)
    r = client.generate(model="m", prompt="x", format="json", options={"num_predict": 200})
    assert r.response.lstrip().startswith("{")

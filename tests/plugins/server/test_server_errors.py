"""Every error the server answers, in OpenAI's error shape, with the right status."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import openai
import pytest

from tessera.plugins.server.testing import live_server
from tessera.text.chat_template import ChatTemplate


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _assert_error(status: int, body: dict, want_status: int, *words: str) -> None:
    assert status == want_status, body
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    for w in words:
        assert w in error["message"]


def test_bad_json_is_400(server):
    status, body = _post(server.v1 + "/chat/completions", b"{not json")
    _assert_error(status, body, 400, "not valid JSON")
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"model": "m"}, ["'messages' is required"]),
        ({"messages": "hi"}, ["'messages' must be"]),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -3}, ["max_tokens"]),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, ["temperature"]),
        ({"messages": [{"role": "user", "content": "x"}], "n": 99}, ["'n'"]),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, ["stop strings"]),
        (
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            ["response_format type 'xml'"],
        ),
    ],
)
def test_bad_fields_are_400_and_name_the_field(server, payload, words):
    status, body = _post(server.v1 + "/chat/completions", json.dumps(payload).encode())
    _assert_error(status, body, 400, *words)


def test_a_prompt_over_the_context_is_400_naming_both_counts(client, server):
    long_prompt = " ".join(["dog"] * 600)
    n = len(server.model.tokenizer.encode(long_prompt))
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt=long_prompt, max_tokens=4)
    message = err.value.body["message"]
    assert f"{n} tokens" in message and "512" in message
    assert err.value.body["code"] == "context_length_exceeded"


def test_unknown_route_is_404(server):
    status, body = _post(server.url + "/v1/nothing-here", b"{}")
    _assert_error(status, body, 404, "no route")


def test_a_10_mb_body_is_413_and_the_server_keeps_serving(client, server):
    big = json.dumps({"prompt": "x" * (10 << 20), "max_tokens": 1}).encode()
    status, body = _post(server.v1 + "/completions", big)
    _assert_error(status, body, 413, "larger than the server's limit")
    assert client.completions.create(model="m", prompt="Hi", max_tokens=1).choices


def test_a_chunked_body_over_the_limit_is_413(server):
    # no Content-Length: the limit is enforced while the body streams in
    def chunks():
        for _ in range(3):
            yield b" " * (600 << 10)

    req = urllib.request.Request(
        server.v1 + "/completions", data=chunks(), headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 413
    assert "limit" in json.loads(err.value.read())["error"]["message"]


def test_all_slots_busy_beyond_the_queue_is_503(server):
    # 3 slots + a queue of 2: the sixth long request is refused at once
    streams = []
    try:
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
            body = json.dumps(
                {"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
            ).encode()
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
            streams.append(s)
        import time

        deadline = time.monotonic() + 60
        while (
            server.model.engine.n_queued
            + sum(s.task is not None for s in server.model.engine.slots)
            < 5
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, body = _post(server.v1 + "/completions", b'{"prompt": "Hi", "max_tokens": 1}')
        _assert_error(status, body, 503, "slots are busy")
    finally:
        for s in streams:
            s.close()


@pytest.mark.parametrize("name", ["../evil.bin", "a/b.bin", "..", ".hidden", "/etc/passwd"])
def test_slot_file_names_with_paths_are_refused(server, name):
    status, body = _post(
        server.url + "/slots/0?action=save", json.dumps({"filename": name}).encode()
    )
    _assert_error(status, body, 400, "invalid slot file name")


def test_unknown_slot_and_unknown_action(server):
    status, body = _post(server.url + "/slots/9?action=erase", b"{}")
    _assert_error(status, body, 404, "slot 9 does not exist")
    status, body = _post(server.url + "/slots/0?action=fly", b"{}")
    _assert_error(status, body, 400, "unknown slot action")
    status, body = _post(server.url + "/slots/0?action=restore", b'{"filename": "none.bin"}')
    _assert_error(status, body, 404, "no slot file")


@pytest.fixture(scope="module")
def keyed_server():
    argv = ["--backend", "numpy", "-np", "1", "-c", "128", "--api-key", "s3cret"]
    with live_server(argv) as srv:
        yield srv


def test_a_wrong_or_missing_api_key_is_401_and_health_stays_open(keyed_server):
    url = keyed_server.v1 + "/models"
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "s3cret"}):
        req = urllib.request.Request(url, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401
        assert json.loads(err.value.read())["error"]["code"] == "invalid_api_key"
    with urllib.request.urlopen(keyed_server.url + "/health", timeout=30) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    good = openai.OpenAI(base_url=keyed_server.v1, api_key="s3cret", max_retries=0)
    assert good.models.list().data[0].context_length == 128
    bad = openai.OpenAI(base_url=keyed_server.v1, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt="hi", max_tokens=1)


def test_slot_actions_without_a_save_path_are_501(keyed_server):
    status, body = _post(
        keyed_server.url + "/slots/0?action=save",
        b'{"filename": "a.bin"}',
        {"Authorization": "Bearer s3cret"},
    )
    _assert_error(status, body, 501, "--slot-save-path")


@pytest.fixture(scope="module")
def untemplated_model(tmp_path_factory):
    from tessera.testing.models import make_gguf

    path = make_gguf(
        tmp_path_factory.mktemp("m") / "tiny.gguf",
        "llama",
        seed=3,
        metadata_overrides={"tokenizer.chat_template": None},
    )
    from tessera.files.gguf import read_gguf

    assert "tokenizer.chat_template" not in read_gguf(path).metadata
    return path


def test_chat_on_a_model_without_a_template_is_400_and_a_flag_fixes_it(untemplated_model):
    argv = ["-m", str(untemplated_model), "--backend", "numpy", "-np", "1", "-c", "128"]
    messages = [{"role": "user", "content": "hi"}]
    with live_server(argv) as srv:
        client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="no chat template"):
            client.chat.completions.create(model="m", messages=messages, max_tokens=2)
        # completions need no template
        assert client.completions.create(model="m", prompt="hi", max_tokens=2).choices
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    chatml += "{% endfor %}<|im_start|>assistant\n"
    with live_server([*argv, "--chat-template", chatml]) as srv:
        client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
        assert r.choices[0].message.role == "assistant"
        text = ChatTemplate(chatml).render(messages, add_generation_prompt=True)
        assert r.usage.prompt_tokens == len(srv.model.tokenizer.encode(text, parse_special=True))

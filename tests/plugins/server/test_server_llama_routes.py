"""llama-server's other routes with plain HTTP: /apply-template and
/chat/completions/input_tokens against the chat route itself, /props with
default_generation_settings against a /completion that sets nothing, POST /props
(--props), /lora-adapters (httpx), and the endpoint switches --no-slots / --no-metrics
(501, as llama-server)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jinja2
import openai
import pytest

from tessera.plugins.server.testing import call, live_server

MESSAGES = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "Hi there"},
]


def test_apply_template_renders_the_models_chat_template(server):
    answer = call(server.url + "/apply-template", {"messages": MESSAGES})
    assert answer.status == 200 and set(answer.json) == {"prompt"}
    template = server.model.model.chat_template
    want = jinja2.Template(template).render(messages=MESSAGES, add_generation_prompt=True)
    assert answer.json["prompt"] == want


def test_input_tokens_counts_what_the_chat_completion_evaluates(server):
    for route in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        answer = call(server.url + route, {"messages": MESSAGES})
        assert answer.status == 200
        assert answer.json["object"] == "response.input_tokens"
        client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
        chat = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)
        assert answer.json["input_tokens"] == chat.usage.prompt_tokens
    bad = call(server.url + "/chat/completions/input_tokens", {"messages": "hi"})
    assert bad.status == 400 and bad.json["error"]["param"] == "messages"


@pytest.mark.parametrize(
    "field",
    [
        {"dry_sequence_breakers": 5},  # a sampler field of the "any" kind
        {"dry_sequence_breakers": [1, 2]},
        {"top_p": 3},
        {"guided_choice": 7},  # an output constraint
        {"logit_bias": {"x": 1}},
        {"id_slot": 99},
    ],
)
def test_the_prompt_routes_refuse_what_the_chat_completion_refuses(server, field):
    body = {"messages": MESSAGES, "max_tokens": 1, **field}
    chat = call(server.url + "/v1/chat/completions", body)
    assert chat.status == 400, chat.json
    for route in ("/apply-template", "/v1/chat/completions/input_tokens"):
        answer = call(server.url + route, body)
        assert (answer.status, answer.json) == (chat.status, chat.json), route


def test_props_has_the_default_generation_settings(server):
    props = call(server.url + "/props").json
    defaults = props["default_generation_settings"]
    assert defaults["n_ctx"] == 512 and props["total_slots"] == 3
    # a request that sets nothing runs with exactly these settings
    ran = call(server.url + "/completion", {"prompt": "Hi", "n_predict": 1}).json
    assert defaults["params"] == {**ran["generation_settings"], "n_predict": -1, "max_tokens": -1}
    # a random seed reads 4294967295, as llama-server's README shows it
    assert defaults["params"]["seed"] == 4294967295 and defaults["params"]["temperature"] == 0.8
    assert (props["endpoint_slots"], props["endpoint_metrics"], props["endpoint_props"]) == (
        True, True, False
    )  # fmt: skip
    assert props["eos_token"] == "<|endoftext|>" and props["model_path"].endswith(".gguf")
    assert props["build_info"].startswith("tessera-")


def test_post_props_needs_the_props_flag(server):
    answer = call(server.url + "/props", {})
    assert answer.status == 501 and answer.json["error"]["type"] == "not_supported_error"


@pytest.fixture(scope="module")
def switched():
    argv = ["--backend", "numpy", "-np", "1", "-c", "128", "--no-slots", "--no-metrics"]
    with live_server([*argv, "--props"]) as srv:
        yield srv


def test_slots_and_metrics_switched_off_are_501(switched):
    for route, flag in (("/slots", "--no-slots"), ("/metrics", "--no-metrics")):
        answer = call(switched.url + route)
        assert answer.status == 501, route
        assert answer.json["error"]["type"] == "not_supported_error"
        assert flag in answer.json["error"]["message"]
    # llama-server's switch hides the listing only: a slot can still be erased
    assert call(switched.url + "/slots/0?action=erase", None, method="POST").status == 200
    props = call(switched.url + "/props").json
    assert (props["endpoint_slots"], props["endpoint_metrics"], props["endpoint_props"]) == (
        False, False, True
    )  # fmt: skip


def test_post_props_with_the_flag(switched):
    assert call(switched.url + "/props", {}).json == {"success": True}
    assert call(switched.url + "/props", None, method="POST").json == {"success": True}
    assert call(switched.url + "/props", b"[1]").status == 400


def test_slots_can_fail_when_none_is_idle():
    with live_server(["--backend", "numpy", "-np", "1", "-c", "512"]) as srv:
        assert call(srv.url + "/slots?fail_on_no_slot=1").status == 200
        body = {"prompt": "Hi", "n_predict": 400, "ignore_eos": True}
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(call, srv.url + "/completion", body)
            deadline = time.monotonic() + 60
            while not call(srv.url + "/slots").json[0]["is_processing"]:
                assert time.monotonic() < deadline and not running.done()
                time.sleep(0.01)
            busy = call(srv.url + "/slots?fail_on_no_slot=1")
            assert busy.status == 503 and busy.json["error"]["type"] == "unavailable_error"
            assert call(srv.url + "/slots").status == 200  # without the parameter: the list
            assert running.result().status == 200


def test_lora_adapters_lists_none_and_takes_only_the_empty_list(server):
    url = server.url + "/lora-adapters"
    assert httpx.get(url, timeout=60).json() == []
    ok = httpx.post(url, json=[], timeout=60)
    assert ok.status_code == 200 and ok.json() == {"success": True}
    refused = httpx.post(url, json=[{"id": 0, "scale": 0.5}], timeout=60)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == 400 and "no LoRA adapter has id 0" in error["message"]
    not_a_list = httpx.post(url, json={"id": 0}, timeout=60)
    assert not_a_list.status_code == 400 and "array" in not_a_list.json()["error"]["message"]
    assert httpx.post(url, content=b"{", timeout=60).status_code == 400
    assert httpx.post(url, content=b"null", timeout=60).status_code == 400


def test_tokenize_add_special_and_parse_special_are_the_tokenizers(server):
    tok = server.model.tokenizer
    bos = tok.token_to_piece(tok.bos_id)
    text = f"{bos}Hello little dog"

    def tokenize(**flags):
        body = {"content": text, **flags}
        return httpx.post(server.url + "/tokenize", json=body, timeout=60).json()["tokens"]

    # llama-server's defaults: no BOS added, special-token text read as the special token
    assert tokenize() == tok.encode(text, add_special=False, parse_special=True)
    assert tokenize()[0] == tok.bos_id
    # add_special adds what the tokenizer adds (this model's GGUF asks for no BOS)
    assert tokenize(add_special=True) == tok.encode(text, add_special=True, parse_special=True)
    as_text = tokenize(parse_special=False)
    assert as_text == tok.encode(text, add_special=False, parse_special=False)
    assert tok.bos_id not in as_text

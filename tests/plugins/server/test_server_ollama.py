"""Ollama's API against the official ``ollama`` client: what it lists, shows, chats,
generates and embeds, compared with tessera's own /v1/chat/completions and
/v1/embeddings for the same greedy request; and the chat fields that decide where the
thinking of those answers goes (reasoning_format, chat_template_kwargs)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import ollama
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Tell me a story about a dog."}]
OPTIONS = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def oc(server):
    return ollama.Client(host=server.url, timeout=120)


def _reference(client, messages, max_tokens=12, **kw):
    return client.chat.completions.create(
        model="m", messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )


def test_chat_gives_the_text_and_counts_of_chat_completions(oc, client):
    ref = _reference(client, MESSAGES)
    out = oc.chat(model="m", messages=MESSAGES, options=OPTIONS)
    assert out.message.role == "assistant"
    assert out.message.content == ref.choices[0].message.content
    assert out.done is True
    assert out.done_reason == ref.choices[0].finish_reason
    assert out.prompt_eval_count == ref.usage.prompt_tokens
    assert out.eval_count == ref.usage.completion_tokens
    assert out.total_duration >= out.eval_duration > 0
    assert out.prompt_eval_duration > 0
    assert out.model == client.models.list().data[0].id


def test_streamed_chat_joins_to_the_whole_answer(oc):
    whole = oc.chat(model="m", messages=MESSAGES, options=OPTIONS)
    parts = list(oc.chat(model="m", messages=MESSAGES, options=OPTIONS, stream=True))
    assert len(parts) > 2
    assert all(p.done is False for p in parts[:-1])
    assert parts[-1].done is True
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count


def test_generate_is_one_user_turn_and_system_goes_first(oc, client):
    ref = _reference(client, MESSAGES)
    out = oc.generate(model="m", prompt=MESSAGES[0]["content"], options=OPTIONS)
    assert out.response == ref.choices[0].message.content
    assert out.eval_count == ref.usage.completion_tokens
    assert out.prompt_eval_count == ref.usage.prompt_tokens
    system = [{"role": "system", "content": "You are terse."}, *MESSAGES]
    ref = _reference(client, system)
    out = oc.generate(
        model="m", prompt=MESSAGES[0]["content"], system="You are terse.", options=OPTIONS
    )
    assert out.response == ref.choices[0].message.content
    streamed = oc.generate(model="m", prompt="Once upon", options=OPTIONS, stream=True)
    whole = oc.generate(model="m", prompt="Once upon", options=OPTIONS)
    assert "".join(p.response for p in streamed) == whole.response


def test_raw_generate_continues_the_prompt_as_a_completion(oc, client):
    ref = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=10, temperature=0
    )
    out = oc.generate(
        model="m",
        prompt="Once upon a time",
        raw=True,
        options={"temperature": 0, "num_predict": 10},
    )
    assert out.response == ref.choices[0].text
    assert out.eval_count == ref.usage.completion_tokens
    assert out.done_reason == ref.choices[0].finish_reason


def test_an_empty_prompt_only_loads_the_model(oc):
    out = oc.generate(model="m", prompt="")
    assert (out.done, out.done_reason, out.response) == (True, "load", "")


def test_options_are_the_sampling_fields(oc, client):
    ref = _reference(client, MESSAGES, max_tokens=24, stop=["the"])
    out = oc.chat(model="m", messages=MESSAGES, options={**OPTIONS, "num_predict": 24,
                                                        "stop": ["the"]})  # fmt: skip
    assert out.message.content == ref.choices[0].message.content
    seeded = {"temperature": 1.0, "seed": 5, "num_predict": 16, "top_k": 20, "min_p": 0.05}
    a = oc.chat(model="m", messages=MESSAGES, options=seeded).message.content
    b = oc.chat(model="m", messages=MESSAGES, options=seeded).message.content
    assert a == b
    ref = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=16, temperature=1.0, seed=5,
        extra_body={"top_k": 20, "min_p": 0.05},
    )  # fmt: skip
    assert a == ref.choices[0].message.content


def test_num_ctx_is_ignored(oc):
    plain = oc.chat(model="m", messages=MESSAGES, options=OPTIONS)
    other = oc.chat(model="m", messages=MESSAGES, options={**OPTIONS, "num_ctx": 64})
    assert other.message.content == plain.message.content


def test_format_json_gives_json(oc):
    out = oc.chat(
        model="m", messages=MESSAGES, format="json", options={"temperature": 1.0, "seed": 3,
                                                               "num_predict": 200}
    )  # fmt: skip
    text = out.message.content
    if out.done_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by num_predict: still the start of an object
        assert text.lstrip().startswith("{")


def test_a_bad_option_is_a_400_naming_it_in_ollamas_shape(oc, server):
    with pytest.raises(ollama.ResponseError) as info:
        oc.chat(model="m", messages=MESSAGES, options={"temperature": 7})
    assert info.value.status_code == 400
    assert "temperature" in info.value.error
    # Ollama's error shape: {"error": message}
    body = json.dumps({"model": "m", "prompt": "Hi", "options": {"top_p": 3}}).encode()
    req = urllib.request.Request(
        server.url + "/api/generate", body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    error = json.loads(http.value.read())
    assert list(error) == ["error"] and "top_p" in error["error"]
    with pytest.raises(ollama.ResponseError) as info:
        oc.chat(model="m", messages=MESSAGES, format={"type": "objectx"})
    assert info.value.status_code == 400 and "objectx" in info.value.error


def test_list_show_and_ps_describe_the_served_model(oc, server):
    served = server.model
    (entry,) = oc.list().models
    assert entry.model == served.name
    assert entry.digest == served.model.identity
    assert entry.details.family == served.model.arch.names[0]
    shown = oc.show(served.name)
    assert shown.details.family == served.model.arch.names[0]
    assert shown.modelinfo["general.architecture"] == served.model.metadata["general.architecture"]
    assert shown.template == served.model.metadata["tokenizer.chat_template"]
    assert "completion" in shown.capabilities
    (running,) = oc.ps().models
    assert running.model == served.name
    assert running.context_length == served.engine.ctx.n_ctx


def test_version_is_the_package_version(server):
    from tessera import __version__

    with urllib.request.urlopen(server.url + "/api/version", timeout=30) as r:
        assert json.loads(r.read()) == {"version": __version__}


def test_embed_gives_the_vectors_of_v1_embeddings(oc, client):
    texts = ["a small dog", "the sea at night"]
    ref = client.embeddings.create(model="m", input=texts)
    out = oc.embed(model="m", input=texts)
    assert len(out.embeddings) == 2
    for got, want in zip(out.embeddings, ref.data, strict=True):
        assert got == pytest.approx(want.embedding, abs=1e-6)
    assert out.prompt_eval_count == ref.usage.prompt_tokens
    one = oc.embeddings(model="m", prompt=texts[0])
    assert one.embedding == pytest.approx(ref.data[0].embedding, abs=1e-6)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_reasoning_is_the_thinking_field_whole_and_streamed(thinking):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    oc = openai.OpenAI(base_url=thinking.v1, api_key="x", max_retries=0)
    ref = oc.chat.completions.create(model="m", messages=messages).choices[0].message
    client = ollama.Client(host=thinking.url, timeout=120)
    out = client.chat(model="m", messages=messages)
    assert out.message.thinking == ref.model_extra["reasoning_content"]
    assert out.message.content == ref.content
    parts = list(client.chat(model="m", messages=messages, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == out.message.thinking
    assert "".join(p.message.content for p in parts) == out.message.content
    generated = client.generate(model="m", prompt=messages[0]["content"])
    assert (generated.thinking, generated.response) == (out.message.thinking, ref.content)


def test_a_tool_call_is_ollamas_tool_calls_as_chat_completions_parse_it(scripted):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    oc = openai.OpenAI(base_url=scripted.v1, api_key="x", max_retries=0)
    ref = oc.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    (want,) = ref.choices[0].message.tool_calls
    client = ollama.Client(host=scripted.url, timeout=120)
    out = client.chat(model="m", messages=messages, tools=TOOLS)
    assert out.message.content == ref.choices[0].message.content
    (call,) = out.message.tool_calls
    assert call.function.name == want.function.name
    assert call.function.arguments == json.loads(want.function.arguments)
    parts = list(client.chat(model="m", messages=messages, tools=TOOLS, stream=True))
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (call.function.name, call.function.arguments)
    ]
    assert "".join(p.message.content for p in parts) == out.message.content


def test_reasoning_format_none_leaves_the_thinking_in_the_content(thinking):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    oc = openai.OpenAI(base_url=thinking.v1, api_key="x", max_retries=0)
    split = oc.chat.completions.create(model="m", messages=messages).choices[0].message
    raw = (
        oc.chat.completions.create(
            model="m", messages=messages, extra_body={"reasoning_format": "none"}
        )
        .choices[0]
        .message
    )
    assert split.model_extra["reasoning_content"] == "Let me see."
    assert raw.model_extra.get("reasoning_content") is None
    assert raw.content == "<think>\nLet me see.\n</think>\n\nIt is sunny."


def test_chat_template_kwargs_reach_the_template(thinking):
    # Qwen3's template writes an empty think block when enable_thinking is false
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    oc = openai.OpenAI(base_url=thinking.v1, api_key="x", max_retries=0)
    plain = oc.chat.completions.create(model="m", messages=messages)
    off = oc.chat.completions.create(
        model="m",
        messages=messages,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    block = thinking.model.tokenizer.encode("<think>\n\n</think>\n\n", add_special=False,
                                            parse_special=True)  # fmt: skip
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens + len(block)


def test_think_sets_the_templates_enable_thinking(thinking):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    client = ollama.Client(host=thinking.url, timeout=120)
    unset = client.chat(model="m", messages=messages)
    on = client.chat(model="m", messages=messages, think=True)
    off = client.chat(model="m", messages=messages, think=False)
    # Qwen3's template writes an empty think block when enable_thinking is false
    block = thinking.model.tokenizer.encode("<think>\n\n</think>\n\n", add_special=False,
                                            parse_special=True)  # fmt: skip
    assert on.prompt_eval_count == unset.prompt_eval_count
    assert off.prompt_eval_count == unset.prompt_eval_count + len(block)
    generated = client.generate(model="m", prompt=messages[0]["content"], think=False)
    assert generated.prompt_eval_count == off.prompt_eval_count
    with pytest.raises(ollama.ResponseError, match="think") as err:
        client.chat(model="m", messages=messages, think="max")
    assert err.value.status_code == 400

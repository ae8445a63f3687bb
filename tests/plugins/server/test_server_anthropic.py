"""Anthropic's Messages API against the official ``anthropic`` client: its parsed messages,
streams and token counts, compared with tessera's own /v1/chat/completions for the same
greedy request, and its error shape."""

from __future__ import annotations

import json
import urllib.request

import anthropic
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Tell me a story about a dog."}]
#: this client has no sampling arguments (newer models take none); the API has the fields
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def _reference(client, messages, max_tokens=12, **kw):
    return client.chat.completions.create(
        model="m", messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )


_STOP = {"stop": "end_turn", "length": "max_tokens"}


def test_a_message_has_the_text_and_usage_of_chat_completions(ac, client):
    ref = _reference(client, MESSAGES)
    out = ac.messages.create(model="m", max_tokens=12, messages=MESSAGES, extra_body=GREEDY)
    assert out.type == "message" and out.role == "assistant"
    (block,) = out.content
    assert block.type == "text"
    assert block.text == ref.choices[0].message.content
    assert out.stop_reason == _STOP[ref.choices[0].finish_reason]
    assert out.usage.input_tokens == ref.usage.prompt_tokens
    assert out.usage.output_tokens == ref.usage.completion_tokens


def test_system_and_blocks_are_the_chat_messages(ac, client):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Tell me "},
                                     {"type": "text", "text": "a story."}]},
        {"role": "assistant", "content": "Once"},
        {"role": "user", "content": "Go on."},
    ]  # fmt: skip
    ref_messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once"},
        {"role": "user", "content": "Go on."},
    ]
    ref = _reference(client, ref_messages, max_tokens=16)
    out = ac.messages.create(
        model="m", max_tokens=16, extra_body=GREEDY, messages=messages,
        system=[{"type": "text", "text": "You are terse."}],
    )  # fmt: skip
    assert "".join(b.text for b in out.content) == (ref.choices[0].message.content or "")
    counted = ac.messages.count_tokens(
        model="m", messages=messages, system=[{"type": "text", "text": "You are terse."}]
    )
    assert counted.input_tokens == ref.usage.prompt_tokens == out.usage.input_tokens


def test_a_stream_has_anthropics_event_sequence_and_the_whole_text(ac):
    kw = dict(model="m", max_tokens=16, messages=MESSAGES, extra_body=GREEDY)
    whole = ac.messages.create(**kw)
    with ac.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert kinds.count("content_block_delta") >= 2
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_stop_sequences_end_the_text_and_are_named(ac, client):
    ref = _reference(client, MESSAGES, max_tokens=24)
    text = ref.choices[0].message.content
    word = text.split()[1]  # the greedy text's second word: it must be met
    out = ac.messages.create(
        model="m", max_tokens=24, extra_body=GREEDY, messages=MESSAGES, stop_sequences=[word]
    )
    assert out.stop_reason == "stop_sequence"
    assert out.stop_sequence == word
    assert out.content[0].text == text[: text.index(word)]


def test_top_k_reaches_the_sampler(ac, client):
    # top_k 1 keeps only the best token: greedy text at any temperature
    ref = _reference(client, MESSAGES, max_tokens=16)
    out = ac.messages.create(
        model="m",
        max_tokens=16,
        messages=MESSAGES,
        extra_body={"temperature": 1.0, "top_k": 1, "top_p": 0.9},
    )
    assert out.content[0].text == ref.choices[0].message.content


def test_errors_have_anthropics_shape(ac):
    with pytest.raises(anthropic.BadRequestError) as info:
        ac.messages.create(
            model="m", max_tokens=16, messages=MESSAGES, extra_body={"temperature": 1.5}
        )
    body = info.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "temperature" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        ac.messages.create(model="m", max_tokens=0, messages=MESSAGES)
    assert "max_tokens" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        ac.messages.create(
            model="m", max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )  # fmt: skip
    assert info.value.body["error"]["type"] == "invalid_request_error"


TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_reasoning_is_a_thinking_block_streamed_as_thinking_deltas(thinking):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    oc = openai.OpenAI(base_url=thinking.v1, api_key="x", max_retries=0)
    ref = oc.chat.completions.create(model="m", messages=messages).choices[0].message
    ac = anthropic.Anthropic(base_url=thinking.url, api_key="x", max_retries=0)
    kw = dict(model="m", max_tokens=64, messages=messages)
    out = ac.messages.create(**kw)
    assert [b.type for b in out.content] == ["thinking", "text"]
    assert out.content[0].thinking == ref.model_extra["reasoning_content"]
    assert out.content[1].text == ref.content
    with ac.messages.stream(**kw) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    assert "thinking_delta" in deltas and "text_delta" in deltas
    assert deltas.index("text_delta") > max(
        i for i, d in enumerate(deltas) if d == "thinking_delta"
    )
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in out.content]


def test_a_tool_call_is_a_tool_use_block_as_chat_completions_parse_it(scripted):
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    fn = {"name": TOOL["name"], "description": TOOL["description"]}
    openai_tool = {"type": "function", "function": {**fn, "parameters": TOOL["input_schema"]}}
    oc = openai.OpenAI(base_url=scripted.v1, api_key="x", max_retries=0)
    ref = oc.chat.completions.create(model="m", messages=messages, tools=[openai_tool])
    (call,) = ref.choices[0].message.tool_calls
    ac = anthropic.Anthropic(base_url=scripted.url, api_key="x", max_retries=0)
    kw = dict(model="m", max_tokens=64, messages=messages, tools=[TOOL])
    out = ac.messages.create(**kw)
    text, use = out.content
    assert (text.type, text.text) == ("text", ref.choices[0].message.content)
    assert use.type == "tool_use" and use.name == call.function.name
    assert use.input == json.loads(call.function.arguments)
    assert out.stop_reason == "tool_use"
    with ac.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == text.text
    assert (final.content[1].name, final.content[1].input) == (use.name, use.input)
    assert final.stop_reason == "tool_use"
    # the tool's result goes back as the tool message of chat completions
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}
    follow = [
        *messages,
        {"role": "assistant", "content": [use.model_dump()]},
        {"role": "user", "content": [result]},
    ]
    counted = ac.messages.count_tokens(model="m", messages=follow, tools=[TOOL])
    call = {"id": use.id, "type": "function",
            "function": {"name": use.name, "arguments": json.dumps(use.input)}}  # fmt: skip
    same = [
        *messages,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use.id, "content": "sunny"},
    ]
    body = json.dumps({"messages": same, "tools": [openai_tool]}).encode()
    req = urllib.request.Request(
        scripted.v1 + "/chat/completions/input_tokens", body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as r:
        assert counted.input_tokens == json.loads(r.read())["input_tokens"]


def test_thinking_sets_the_templates_enable_thinking(thinking):
    ac = anthropic.Anthropic(base_url=thinking.url, api_key="x", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    count = ac.messages.count_tokens
    unset = count(model="m", messages=messages).input_tokens
    on = count(model="m", messages=messages, thinking={"type": "enabled", "budget_tokens": 1024})
    off = count(model="m", messages=messages, thinking={"type": "disabled"})
    # Qwen3's template writes an empty think block when enable_thinking is false
    block = thinking.model.tokenizer.encode("<think>\n\n</think>\n\n", add_special=False,
                                            parse_special=True)  # fmt: skip
    assert on.input_tokens == unset
    assert off.input_tokens == unset + len(block)
    answer = ac.messages.create(model="m", max_tokens=32, messages=messages,
                                thinking={"type": "disabled"})  # fmt: skip
    assert answer.usage.input_tokens == off.input_tokens
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        ac.messages.create(model="m", max_tokens=8, messages=messages, thinking={"type": "max"})

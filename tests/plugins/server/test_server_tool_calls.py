"""Tool calls through the HTTP layer, read by the official client.

A random or tiny model does not write tool calls on its own, so the slot engine is
replaced by a scripted one that "generates" a fixed answer token by token; everything
from the chat template to the OpenAI JSON is the real server.
"""

from __future__ import annotations

import json

import openai

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


def _ask(srv, **kw):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)


def test_a_tool_call_becomes_tool_calls_and_the_text_stays_content(scripted):
    r = _ask(scripted)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id
    # the tools were rendered into the prompt by the model's template
    prompt = scripted.model.tokenizer.decode(scripted.model.engine.requests[-1].prompt)
    assert "get_weather" in prompt and "<tools>" in prompt


def test_a_streamed_tool_call_is_assembled_by_the_client(scripted):
    chunks = list(_ask(scripted, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert content == "Let me check."
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_keeps_the_tools_out_and_the_text_as_text(scripted):
    r = _ask(scripted, tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert "<tool_call>" in r.choices[0].message.content
    prompt = scripted.model.tokenizer.decode(scripted.model.engine.requests[-1].prompt)
    assert "get_weather" not in prompt

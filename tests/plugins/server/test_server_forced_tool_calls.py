"""tool_choice "required" and a named function (Anthropic's {type: any} and {type: tool,
name} through the official ``anthropic`` client) are enforced by a constraint: the default
model (which never writes tool calls on its own) answers with a call of a declared tool in
the chat format's syntax, parsed back by the chat plugin, its arguments valid against the
tool's schema (jsonschema is the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest

from tessera.plugins.server.testing import live_server

TEMPLATE = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
QWEN = TEMPLATE / "Qwen-Qwen2.5-7B-Instruct.jinja"
WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer",
                   "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}  # fmt: skip
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather?"}]


@pytest.fixture(scope="module")
def srv():
    argv = ["--backend", "numpy", "-np", "1", "-c", "1024", "--chat-template", str(QWEN)]
    with live_server(argv) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ac(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)


def calls(client, tool_choice, seed):
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=400,
        temperature=1.0, seed=seed,
    )  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls"
    return r.choices[0].message.tool_calls


def test_required_tool_choice_returns_a_call_of_a_declared_tool(client):
    for seed in range(3):
        (call,) = calls(client, "required", seed)
        assert call.function.name in SCHEMAS
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_named_tool_choice_calls_that_tool(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(2):
        (call,) = calls(client, choice, seed)
        assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), TIME)


def test_a_tool_choice_naming_no_declared_tool_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        calls(client, {"type": "function", "function": {"name": "nope"}}, 0)
    assert "'nope'" in err.value.body["message"]


#: the same tools in Anthropic's form
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "description": "", "input_schema": t["function"]["parameters"]}
    for t in TOOLS
]


def tool_uses(message) -> list:
    assert message.stop_reason == "tool_use"
    return [b for b in message.content if b.type == "tool_use"]


def test_anthropic_tool_choice_any_returns_a_tool_use_of_a_declared_tool(ac):
    for _ in range(2):  # sampled at Anthropic's default temperature 1
        message = ac.messages.create(
            model="m", max_tokens=400, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "any"},
        )  # fmt: skip
        (use,) = tool_uses(message)
        assert use.name in SCHEMAS
        jsonschema.validate(use.input, SCHEMAS[use.name])


def test_anthropic_named_tool_choice_uses_that_tool_streamed_too(ac):
    kw = {"model": "m", "max_tokens": 400, "messages": MESSAGES, "tools": ANTHROPIC_TOOLS,
          "tool_choice": {"type": "tool", "name": "get_time"}}  # fmt: skip
    (use,) = tool_uses(ac.messages.create(**kw))
    assert use.name == "get_time"
    jsonschema.validate(use.input, TIME)
    with ac.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    (use,) = tool_uses(final)
    assert use.name == "get_time"
    jsonschema.validate(use.input, TIME)


def test_an_anthropic_tool_choice_naming_no_declared_tool_is_400(ac):
    with pytest.raises(anthropic.BadRequestError) as err:
        ac.messages.create(
            model="m", max_tokens=10, messages=MESSAGES, tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "tool", "name": "nope"},
        )  # fmt: skip
    assert "'nope'" in err.value.body["error"]["message"]

"""tool_choice "required" and a named function are enforced by a constraint: the default
model (which never writes tool calls on its own) answers with a call of a declared tool in
the chat format's syntax, parsed back by the chat plugin, its arguments valid against the
tool's schema (jsonschema is the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

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
def client():
    argv = ["--backend", "numpy", "-np", "1", "-c", "1024", "--chat-template", str(QWEN)]
    with live_server(argv) as srv:
        yield openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=120)


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

"""tessera.LLM.chat's tools: rendered into the chat template as the live server renders
them (its /apply-template and /v1/chat/completions are the oracle), kept out with
tool_choice "none", and a forced tool call refused with the way out."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import tessera
from tessera.errors import TesseraError
from tessera.plugins.server.testing import live_server

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "chat-templates"
TEMPLATE = TEMPLATE / "Qwen-Qwen2.5-7B-Instruct.jinja"
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
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def llm():
    source = TEMPLATE.read_text(encoding="utf-8")
    with tessera.LLM(backend="numpy", n_ctx=512, chat_template=source) as model:
        yield model


@pytest.fixture(scope="module")
def server():
    flags = ["--backend", "numpy", "-np", "1", "-c", "512", "--chat-template", str(TEMPLATE)]
    with live_server(flags) as srv:
        yield srv


def _post(server, route: str, body: dict) -> dict:
    response = httpx.post(server.url + route, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_tools_are_rendered_as_the_server_renders_them(llm, server):
    prompt = llm.chat_prompt(MESSAGES, TOOLS)
    assert '"name": "get_weather"' in prompt and prompt != llm.chat_prompt(MESSAGES)
    assert (
        prompt == _post(server, "/apply-template", {"messages": MESSAGES, "tools": TOOLS})["prompt"]
    )


def test_a_chat_with_tools_is_the_servers_answer(llm, server):
    kw = {"max_tokens": 8, "temperature": 0, "tools": TOOLS, "tool_choice": "auto"}
    got = llm.chat(MESSAGES, **kw)
    want = _post(server, "/v1/chat/completions", {"messages": MESSAGES, **kw})
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    plain = llm.chat(MESSAGES, max_tokens=8, temperature=0)
    assert plain["usage"]["prompt_tokens"] < got["usage"]["prompt_tokens"]


def test_tool_choice_none_keeps_the_tools_out(llm):
    kw = {"max_tokens": 3, "temperature": 0}
    none = llm.chat(MESSAGES, tools=TOOLS, tool_choice="none", **kw)
    assert none == {**llm.chat(MESSAGES, **kw), "id": none["id"], "created": none["created"]}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tools": TOOLS, "tool_choice": "required"}, "would force a tool call.*'auto' or 'none'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "would force a tool call",
        ),
        ({"tools": [{"name": "get_weather"}]}, "tools must be a list of function tools"),
        ({"tools": "get_weather"}, "tools must be a list of function tools"),
    ],
)
def test_what_chat_cannot_do_with_tools_is_one_clear_error(llm, kw, message):
    with pytest.raises(TesseraError, match=message):
        llm.chat(MESSAGES, max_tokens=1, **kw)

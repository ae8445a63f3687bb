"""gpt-oss's harmony answers through /v1/chat/completions, read by the official client.

The model served is the gpt-oss fixture (tests/data/arch/gpt-oss, llama.cpp's GGUF with the
harmony tokens and gpt-oss's chat template). A random model does not write harmony on its
own, so the slot engine is replaced by a scripted one that "generates" a hand-written
answer token by token (the special tokens as the tokenizer has them); it stops before the
<|call|> or <|return|> that would end generation, as the engine does. Everything from the
chat template to the OpenAI JSON is the real server.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tessera.plugins.server.testing import ScriptedEngine, live_server

MODEL = Path(__file__).resolve().parents[2] / "data" / "arch" / "gpt-oss" / "gpt-oss-f32.gguf"
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
CALL_ANSWER = (
    "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)
FINAL_ANSWER = (
    "<|channel|>analysis<|message|>Simple question.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is 18C in Paris."
)


@pytest.fixture(scope="module")
def served():
    with live_server(["-m", str(MODEL), "--backend", "numpy", "-np", "1", "-c", "2048"]) as srv:
        srv.model.engine = ScriptedEngine(srv.model.engine)
        yield srv


def _ask(srv, answer, **kw):
    model = srv.model
    tokens = model.tokenizer.encode(answer, add_special=False, parse_special=True)
    # the harmony markers are single special tokens of the model, not spelled out
    assert (
        model.tokenizer.encode("<|channel|>", add_special=False, parse_special=True)
        == [t for t in tokens if model.tokenizer.token_to_piece(t) == "<|channel|>"][:1]
    )
    model.engine.tokens = tokens
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    return client.chat.completions.create(model="m", messages=messages, tools=TOOLS, **kw)


def test_a_harmony_tool_call_becomes_tool_calls_and_the_analysis_reasoning(served):
    choice = _ask(served, CALL_ANSWER).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == (
        "The user wants the weather; call the tool."
    )
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id
    # the model's own template rendered the prompt, the tools in its functions namespace
    prompt = served.model.tokenizer.decode(served.model.engine.requests[-1].prompt)
    assert prompt.startswith("<|start|>system<|message|>")
    assert "namespace functions" in prompt and "type get_weather" in prompt
    assert prompt.endswith("<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant")


def test_a_streamed_harmony_tool_call_is_assembled_by_the_client(served):
    chunks = list(_ask(served, CALL_ANSWER, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "The user wants the weather; call the tool."
    assert "".join(d.content or "" for d in deltas) == ""
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_final_channel_is_the_content(served, stream):
    reply = _ask(served, FINAL_ANSWER, stream=stream)
    if stream:
        deltas = [c.choices[0].delta for c in reply if c.choices]
        content = "".join(d.content or "" for d in deltas)
        reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    else:
        message = reply.choices[0].message
        content, reasoning = message.content, message.model_extra["reasoning_content"]
        assert reply.choices[0].finish_reason == "stop" and message.tool_calls is None
    assert (content, reasoning) == ("It is 18C in Paris.", "Simple question.")


def test_tool_choice_none_keeps_the_call_as_text(served):
    message = _ask(served, CALL_ANSWER, tool_choice="none").choices[0].message
    assert message.tool_calls is None
    assert message.content == CALL_ANSWER.split("<|end|>")[1]  # the call message as written
    prompt = served.model.tokenizer.decode(served.model.engine.requests[-1].prompt)
    assert "get_weather" not in prompt

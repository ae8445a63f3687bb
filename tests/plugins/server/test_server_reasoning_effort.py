"""OpenAI's ``reasoning_effort`` on /v1/chat/completions, sent by the official client: a
level is the chat template's ``reasoning_effort`` (gpt-oss's template writes it into its
system message), ``none`` its ``enable_thinking`` off (Qwen3's template then writes an
empty think block), as llama-server does. The oracle is the same template rendered with
those variables given through ``chat_template_kwargs`` (POST /apply-template); the prompt
the chat completion evaluated is read from the engine."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
import pytest

from tessera.plugins.server.chat_completions import prompt_tokens
from tessera.plugins.server.testing import live_server

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


class RecordingEngine:
    """The slot engine, with the prompt of every request it is given kept."""

    def __init__(self, real):
        self.real, self.prompts = real, []

    def submit(self, request, on_event):
        self.prompts.append(list(request.prompt))
        return self.real.submit(request, on_event)

    def __getattr__(self, name):
        return getattr(self.real, name)


def _serve(template: str):
    argv = ["--backend", "numpy", "-np", "1", "-c", "1024", "--chat-template"]
    return live_server([*argv, str(TEMPLATES / template)])


@pytest.fixture(scope="module")
def gpt_oss():
    with _serve("openai-gpt-oss-120b.jinja") as srv:
        srv.model.engine = RecordingEngine(srv.model.engine)
        yield srv


@pytest.fixture(scope="module")
def qwen3():
    with _serve("Qwen-Qwen3-0.6B.jinja") as srv:
        srv.model.engine = RecordingEngine(srv.model.engine)
        yield srv


def _rendered(srv, **body) -> str:
    data = json.dumps({"messages": MESSAGES, **body}).encode()
    request = urllib.request.Request(
        srv.url + "/apply-template", data, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)["prompt"]


def _evaluated(srv, **kw) -> list[int]:
    """The prompt tokens a chat completion with ``kw`` evaluated."""
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1, **kw)
    return srv.model.engine.prompts[-1]


def _tokens(srv, text: str) -> list[int]:
    return prompt_tokens(srv.model, text)


@pytest.mark.parametrize("level", ["low", "high"])
def test_a_level_is_the_templates_reasoning_effort(gpt_oss, level):
    want = _rendered(gpt_oss, chat_template_kwargs={"reasoning_effort": level})
    assert f"Reasoning: {level}\n" in want
    assert _evaluated(gpt_oss, reasoning_effort=level) == _tokens(gpt_oss, want)
    assert _rendered(gpt_oss, reasoning_effort=level) == want


def test_unset_the_template_keeps_its_own_default(gpt_oss):
    assert "Reasoning: medium\n" in _rendered(gpt_oss)
    assert _evaluated(gpt_oss) == _tokens(gpt_oss, _rendered(gpt_oss))


def test_the_field_wins_over_chat_template_kwargs(gpt_oss):
    # llama-server sets the field's level after merging chat_template_kwargs
    both = {"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}
    want = _rendered(gpt_oss, chat_template_kwargs={"reasoning_effort": "high"})
    assert _rendered(gpt_oss, **both) == want
    assert _evaluated(gpt_oss, reasoning_effort="high",
                      extra_body={"chat_template_kwargs": {"reasoning_effort": "low"}}) == (
        _tokens(gpt_oss, want))  # fmt: skip


def test_none_turns_the_templates_thinking_off(qwen3):
    off = _rendered(qwen3, chat_template_kwargs={"enable_thinking": False})
    assert off == _rendered(qwen3) + "<think>\n\n</think>\n\n"  # Qwen3's empty think block
    assert _evaluated(qwen3, reasoning_effort="none") == _tokens(qwen3, off)
    # a level leaves thinking on, as it is by default
    assert _evaluated(qwen3, reasoning_effort="high") == _tokens(qwen3, _rendered(qwen3))


def test_an_unknown_level_is_a_400_naming_the_field_and_the_levels(qwen3):
    client = openai.OpenAI(base_url=qwen3.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=MESSAGES, reasoning_effort="maximal")
    message = err.value.body["message"]
    assert message.startswith("'reasoning_effort' must be one of none, minimal, low, medium, ")
    assert "'maximal'" in message
    assert err.value.body["param"] == "reasoning_effort"

"""A live server on the default model (numpy backend: the reference numbers) per module,
and servers whose model answers a fixed text (a tiny model writes no tool calls or
thinking blocks): the template, parsing and HTTP are the real server's."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from tessera.plugins.server.testing import live_server, scripted_answer

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
#: What the ``scripted`` server's model answers: text, then a Hermes-style call.
TOOL_CALL_ANSWER = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    argv = ["--backend", "numpy", "-np", "3", "-c", "512", "-b", "64"]
    argv += ["--slot-save-path", str(slots), "--max-queue", "2", "--pooling", "mean"]
    with live_server(argv) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


@contextlib.contextmanager
def _scripted(template: str, answer: str):
    argv = ["--backend", "numpy", "-np", "1", "-c", "512"]
    argv += ["--chat-template", str(TEMPLATES / template)]
    with live_server(argv) as srv, scripted_answer(srv, answer):
        yield srv


@pytest.fixture(scope="module")
def scripted():
    """Qwen2.5's template; the model answers :data:`TOOL_CALL_ANSWER`."""
    with _scripted("Qwen-Qwen2.5-7B-Instruct.jinja", TOOL_CALL_ANSWER) as srv:
        yield srv


@pytest.fixture(scope="module")
def thinking():
    """Qwen3's template; the model answers a thinking block, then "It is sunny."."""
    answer = "<think>\nLet me see.\n</think>\n\nIt is sunny."
    with _scripted("Qwen-Qwen3-0.6B.jinja", answer) as srv:
        yield srv

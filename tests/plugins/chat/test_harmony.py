"""gpt-oss's harmony format: prompts as transformers renders the model's template, answers
(hand-written in the syntax OpenAI documents for harmony) split by channel and recipient.

The oracle for prompts is transformers' ``apply_chat_template`` on the template of the
gpt-oss fixture's ``tokenizer_config.json``; for streaming, ``finish()`` on the whole text
fed at once, which every split of the text into pieces must reproduce delta by delta.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import pytest
from chat_stream_checks import check_streamed, stream, weather_call
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.plugins.chat.format import detect_chat_format
from tessera.plugins.chat.harmony import harmony_messages
from tessera.plugins.chat.session import ChatSession, ReasoningPart, TextPart
from tessera.text.chat_template import ChatTemplate

DATA = Path(__file__).resolve().parents[2] / "data"
HF_DIR = DATA / "arch" / "gpt-oss" / "hf"
SOURCE = json.loads((HF_DIR / "tokenizer_config.json").read_text())["chat_template"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
USER = [{"role": "user", "content": "Weather in Paris?"}]
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|constrain|>")
CALL = (
    '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)


# (session options, generated text, the parts it must give)
CASES = {
    "analysis-then-final": (
        {},
        "<|channel|>analysis<|message|>User asks about weather. No tool needed.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.",
        [
            ReasoningPart("User asks about weather. No tool needed."),
            TextPart("It is sunny in Paris."),
        ],
    ),
    "final-up-to-return": ({}, "<|channel|>final<|message|>Hi!<|return|>", [TextPart("Hi!")]),
    # the call's end (<|call|>) ends generation, so the text stops before it
    "analysis-then-call": (
        {},
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant" + CALL,
        [ReasoningPart("Need the weather."), weather_call("Paris")],
    ),
    # the recipient in the role header, right after the prompt's <|start|>assistant
    "recipient-in-role-header": (
        {},
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Rome"}<|call|>',
        [weather_call("Rome")],
    ),
    "preamble-then-call": (
        {},
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant" + CALL,
        [TextPart("Let me check."), weather_call("Paris")],
    ),
    "stray-commentary-before-analysis": (
        {},
        "<|channel|>commentary<|channel|>analysis<|message|>Hmm.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.",
        [ReasoningPart("Hmm."), TextPart("Done.")],
    ),
    "two-analysis-messages-one-part": (
        {},
        "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Second.<|end|><|start|>assistant<|channel|>final<|message|> Answer. ",
        [ReasoningPart("First.\nSecond."), TextPart("Answer. ")],
    ),
    "builtin-tool-is-reasoning": (
        {},
        "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>",
        [ReasoningPart("print(6 * 7)")],
    ),
    "unoffered-tool-stays-text": (
        {},
        "<|channel|>commentary to=functions.get_time json<|message|>{}",
        [TextPart("<|channel|>commentary to=functions.get_time json<|message|>{}")],
    ),
    "bad-json-stays-text": (
        {},
        '<|channel|>commentary to=functions.get_weather json<|message|>{"city": <|call|>',
        [
            TextPart(
                '<|channel|>commentary to=functions.get_weather json<|message|>{"city": <|call|>'
            )
        ],
    ),
    "tool-choice-none-call-stays-text": (
        {"tool_choice": "none"},
        CALL,
        [TextPart(CALL)],
    ),
    "reasoning-format-none-keeps-analysis-as-written": (
        {"reasoning_format": "none"},
        "<|channel|>analysis<|message|>think <|end|>"
        "<|start|>assistant<|channel|>final<|message|>ok",
        [TextPart("<|channel|>analysis<|message|>think <|end|>ok")],
    ),
    "reasoning-cut-off-by-max-tokens": (
        {},
        "<|channel|>analysis<|message|>Thinking about it ",
        [ReasoningPart("Thinking about it")],
    ),
    "a-header-that-never-ends-is-text": (
        {},
        "<|channel|>" + "x" * 300 + "<|start|>assistant<|channel|>final<|message|>y",
        [TextPart("<|channel|>" + "x" * 300 + "y")],
    ),
    "not-harmony-at-all": (
        {},
        "Plain words, then a <|channel|>final<|message|>x",
        [TextPart("Plain words, then a x")],
    ),
}


#: A template the harmony format is detected in that renders at once: the many sessions of
#: the split tests need the parser, not the gpt-oss prompt.
QUICK_SOURCE = "{# <|channel|> <|message|> #}{{ '<|start|>assistant' }}"


def _session(tools=TOOLS, messages=USER, source=SOURCE, **kwargs) -> ChatSession:
    counter = itertools.count()
    return ChatSession(
        ChatTemplate(source, "<|startoftext|>", "<|return|>"),
        None,
        messages,
        tools=tools,
        id_factory=lambda: f"call{next(counter)}",
        **kwargs,
    )


@pytest.mark.parametrize("case", CASES)
def test_whole_text_gives_the_expected_parts(case):
    options, text, parts = CASES[case]
    assert stream(_session(**options), [text])[1].parts == parts


def _check_split(case: str, pieces: list[str]) -> None:
    options, text, parts = CASES[case]
    deltas, result = stream(_session(source=QUICK_SOURCE, **options), pieces)
    check_streamed(deltas, result, parts, MARKERS)


@pytest.mark.parametrize("case", CASES)
def test_every_two_piece_split_and_char_by_char(case):
    text = CASES[case][1]
    for cut in range(len(text) + 1):
        _check_split(case, [text[:cut], text[cut:]])
    _check_split(case, list(text))


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(sorted(CASES)), cuts=st.lists(st.integers(0, 300), max_size=12))
def test_any_split_streams_the_same_answer(case, cuts):
    text = CASES[case][1]
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    _check_split(case, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])


def test_reasoning_streams_before_its_message_ends_and_a_partial_marker_waits():
    session = _session()
    assert session.feed("<|channel|>analysis<|message|>Let me") == [{"reasoning_content": "Let me"}]
    assert session.feed(" think <|en") == [{"reasoning_content": " think"}]
    assert session.feed("d|><|start|>assistant<|channel|>final<|mess") == []
    assert session.feed("age|>Yes.") == [{"content": "Yes."}]


def test_a_call_is_sent_whole_and_the_message_is_openais():
    session = _session()
    assert session.feed(CALL[:-3]) == []  # the JSON is not closed yet
    session.feed(CALL[-3:])
    result = session.finish()
    assert result.deltas[0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert result.finish_reason == "tool_calls"
    assert result.message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [weather_call("Paris").to_openai()],
    }


def test_the_gpt_oss_template_is_harmony_and_others_are_not():
    assert detect_chat_format(SOURCE).harmony
    qwen = (DATA / "chat-templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    assert not detect_chat_format(qwen).harmony


HISTORY = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "reasoning_content": "Need the tool.",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "assistant", "content": "18C in Paris.", "reasoning_content": "Read it."},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.mark.parametrize(
    "kwargs", [{}, {"reasoning_effort": "high"}, {"model_identity": "You are a test."}]
)
@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
@pytest.mark.parametrize("turns", [len(HISTORY), 4], ids=["answered", "after-the-tool"])
def test_prompt_matches_transformers(kwargs, tools, turns):
    from transformers import AutoTokenizer

    history = HISTORY[:turns]
    hf = AutoTokenizer.from_pretrained(HF_DIR)
    # the template reads the reasoning as "thinking" (what llama.cpp hands it too)
    expected = hf.apply_chat_template(
        harmony_messages(history), tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
    )
    # the server receives arguments as OpenAI sends them: JSON text
    openai_history = copy.deepcopy(history)
    call = openai_history[2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(call["arguments"])
    session = _session(tools=tools, messages=openai_history, template_kwargs=kwargs)
    assert session.prompt() == expected
    assert expected.endswith("<|end|><|start|>assistant")
    call_text = 'to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
    assert call_text in expected
    # the call's reasoning is rendered until a final answer follows it
    analysis = "<|channel|>analysis<|message|>Need the tool.<|end|>"
    assert (analysis in expected) == (turns == 4)


def test_reasoning_content_becomes_thinking_and_replaces_a_calls_content():
    adjusted = harmony_messages(HISTORY)
    assert adjusted[2]["thinking"] == "Need the tool." and "content" not in adjusted[2]
    assert adjusted[4]["thinking"] == "Read it." and adjusted[4]["content"] == "18C in Paris."
    assert HISTORY[2]["content"] == ""  # the caller's messages are not changed

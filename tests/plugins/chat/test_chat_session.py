"""The chat layer: prompts match transformers, answers split into text/reasoning/tool-call parts.

The oracle for prompts is transformers' ``apply_chat_template`` on a tokenizer carrying the same
template; the oracle for streaming is ``finish()`` on the whole text fed at once, which every
split of the text into pieces must reproduce delta by delta.
"""

from __future__ import annotations

import copy
import itertools
import json
from functools import cache
from pathlib import Path

import pytest
from chat_stream_checks import check_streamed, joined, stream, weather_call
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.errors import TesseraError
from tessera.plugins.chat.format import (
    BUILTIN_SYNTAXES,
    ToolCallSyntax,
    detect_chat_format,
    json_value_end,
)
from tessera.plugins.chat.session import (
    ChatRequestError,
    ChatSession,
    NoChatTemplateError,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    chat_template,
    has_own_chat_template,
)
from tessera.text.chat_template import ChatTemplate, ChatTemplateError

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
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
USER = [{"role": "user", "content": "Weather in Paris and Rome?"}]
MARKERS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[THINK]",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
)


@cache
def _template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATE_DIR / f"{name}.jinja").read_text(), "<s>", "</s>")


def _session(name: str, tools=TOOLS, **kwargs) -> ChatSession:
    counter = itertools.count()
    return ChatSession(
        _template(name),
        None,
        USER,
        tools=tools,
        id_factory=lambda: f"call{next(counter)}",
        **kwargs,
    )


HERMES_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
UNFINISHED_DEEPSEEK_CALL = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
)
# (template, session options, generated text, the parts it must give)
CASES = {
    "qwen3-reasoning-content-two-calls": (
        "Qwen-Qwen3-0.6B",
        {},
        "<think>\nTwo cities, two calls.\n</think>\n\nLet me check.\n" + HERMES_CALLS,
        [
            ReasoningPart("Two cities, two calls."),
            TextPart("Let me check."),
            weather_call("Paris", 0),
            weather_call("Rome", 1),
        ],
    ),
    "qwen3-thinking-disabled": (
        "Qwen-Qwen3-0.6B",
        {"template_kwargs": {"enable_thinking": False}},
        "It is <b>sunny</b> & 18 < 20.",
        [TextPart("It is <b>sunny</b> & 18 < 20.")],
    ),
    "qwen3-malformed-json-is-text": (
        "Qwen-Qwen3-0.6B",
        {},
        'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
        " Done.",
        [
            TextPart(
                'Calling.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n'
                "</tool_call> Done."
            )
        ],
    ),
    "qwen3-call-cut-off-by-max-tokens": (
        "Qwen-Qwen3-0.6B",
        {},
        '<tool_call>\n{"name": "get_weather", "arguments": {"ci',
        [TextPart('<tool_call>\n{"name": "get_weather", "arguments": {"ci')],
    ),
    "qwen3-unclosed-but-complete-call": (
        "Qwen-Qwen3-0.6B",
        {},
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
        [weather_call("Paris", 0)],
    ),
    "qwen3-unclosed-reasoning": (
        "Qwen-Qwen3-0.6B",
        {},
        "<think>\nStill thinking <tool_call> is not parsed in here",
        [ReasoningPart("Still thinking <tool_call> is not parsed in here")],
    ),
    "qwen2.5-marker-lookalikes": (
        "Qwen-Qwen2.5-7B-Instruct",
        {},
        "a <tool b <tool_cal c <tool_call",
        [TextPart("a <tool b <tool_cal c <tool_call")],
    ),
    "qwen2.5-content-between-calls": (
        "Qwen-Qwen2.5-7B-Instruct",
        {},
        HERMES_CALLS.replace("</tool_call>\n<tool", "</tool_call>\nand then\n<tool") + "\nok",
        [weather_call("Paris", 0), TextPart("and then"), weather_call("Rome", 1), TextPart("ok")],
    ),
    "hermes3-call": (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        {},
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>',
        [weather_call("Paris", 0)],
    ),
    "qwen3-tool-choice-none-leaves-text": (
        "Qwen-Qwen3-0.6B",
        {"tool_choice": "none"},
        '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
        [TextPart('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')],
    ),
    "qwen3-reasoning-format-none": (
        "Qwen-Qwen3-0.6B",
        {"reasoning_format": "none", "tools": None},
        "<think>\nhm\n</think>\n\nHi",
        [TextPart("<think>\nhm\n</think>\n\nHi")],
    ),
    "deepseek-r1-forced-open": (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        {"template_kwargs": {"enable_thinking": True}, "tools": None},
        "The user greets.\n</think>\n\nHello!",
        [ReasoningPart("The user greets."), TextPart("Hello!")],
    ),
    "llama3-bare-json-call": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        '\n{"name": "get_weather", "parameters": {"city": "Paris"}}',
        [weather_call("Paris", 0)],
    ),
    "llama3-python-tag-call": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}',
        [weather_call("Rome", 0)],
    ),
    "llama3-braces-and-quotes-inside-strings": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        json.dumps({"name": "get_weather", "parameters": {"city": 'Pa"}ris\\'}}) + " Sent.",
        [weather_call('Pa"}ris\\', 0), TextPart("Sent.")],
    ),
    "llama3-text-then-tagged-then-bare-call": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        'Checking.<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}\n'
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        [TextPart("Checking."), weather_call("Paris", 0), weather_call("Rome", 1)],
    ),
    "llama3-json-answer-is-not-a-call": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        '{"name": "Paris", "parameters": {"pop": 2}} is the JSON {you} asked for.',
        [TextPart('{"name": "Paris", "parameters": {"pop": 2}} is the JSON {you} asked for.')],
    ),
    "mistral-nemo-json-list": (
        "mistralai-Mistral-Nemo-Instruct-2407",
        {},
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"},'
        ' {"name": "get_weather", "arguments": {"city": "Rome"}, "id": "f5g6h7i8j"}]',
        [
            ToolCallPart("a1b2c3d4e", "get_weather", json.dumps({"city": "Paris"})),
            ToolCallPart("f5g6h7i8j", "get_weather", json.dumps({"city": "Rome"})),
        ],
    ),
    "mistral-nemo-list-with-a-bad-entry-is-text": (
        "mistralai-Mistral-Nemo-Instruct-2407",
        {},
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"oops": 1}]',
        [
            TextPart(
                '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"oops": 1}]'
            )
        ],
    ),
    "mistral-args-without-json": (
        "Mistral-Small-3.2-24B-Instruct-2506",
        {},
        "[TOOL_CALLS]get_weather[ARGS]Paris[TOOL_CALLS]get_weather[ARGS]{}",
        [
            TextPart("[TOOL_CALLS]get_weather[ARGS]Paris"),
            ToolCallPart("call0", "get_weather", "{}"),
        ],
    ),
    "llama3-python-tag-without-json": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        '<|python_tag|>brave_search.call(query="x")<|python_tag|>{"name": "get_weather", '
        '"parameters": {"city": "Rome"}}',
        [TextPart('<|python_tag|>brave_search.call(query="x")'), weather_call("Rome", 0)],
    ),
    "llama3-long-json-answer-streams": (
        "meta-llama-Llama-3.1-8B-Instruct",
        {},
        json.dumps({"cities": ["Paris", "Rome", "Oslo", "Lima", "Kyiv", "Baku"] * 4, "n": 24}),
        [
            TextPart(
                json.dumps(
                    {"cities": ["Paris", "Rome", "Oslo", "Lima", "Kyiv", "Baku"] * 4, "n": 24}
                )
            )
        ],
    ),
    "deepseek-r1-fenced-calls": (
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        {"template_kwargs": {"enable_thinking": True}},
        "Two cities.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>'
        'function<｜tool▁sep｜>get_weather\n```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        [ReasoningPart("Two cities."), weather_call("Paris", 0), weather_call("Rome", 1)],
    ),
    "deepseek-v3.1-calls": (
        "deepseek-ai-DeepSeek-V3.1",
        {},
        "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [TextPart("On it."), weather_call("Paris", 0)],
    ),
    "deepseek-call-without-its-end-is-text": (
        "deepseek-ai-DeepSeek-V3.1",
        {},
        UNFINISHED_DEEPSEEK_CALL,
        [TextPart(UNFINISHED_DEEPSEEK_CALL)],
    ),
    "mistral-small-args-form": (
        "Mistral-Small-3.2-24B-Instruct-2506",
        {},
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
        [weather_call("Paris", 0), weather_call("Rome", 1)],
    ),
    "ministral-reasoning": (
        "mistralai-Ministral-3-14B-Reasoning-2512",
        {},
        '[THINK]Need weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}',
        [ReasoningPart("Need weather."), weather_call("Rome", 0)],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_whole_text_gives_the_expected_parts(case):
    name, options, text, parts = CASES[case]
    _, result = stream(_session(name, **options), [text])
    assert result.parts == parts


def _check_split(case: str, pieces: list[str]) -> None:
    name, options, text, parts = CASES[case]
    deltas, result = stream(_session(name, **options), pieces)
    check_streamed(deltas, result, parts, MARKERS)


@pytest.mark.parametrize("case", CASES)
def test_every_two_piece_split_and_char_by_char(case):
    text = CASES[case][2]
    for cut in range(len(text) + 1):
        _check_split(case, [text[:cut], text[cut:]])
    _check_split(case, list(text))


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(sorted(CASES)), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_any_split_streams_the_same_answer(case, cuts):
    text = CASES[case][2]
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    _check_split(case, [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)])


def test_partial_marker_is_held_until_disambiguated():
    session = _session("Qwen-Qwen3-0.6B", template_kwargs={"enable_thinking": False})
    assert session.feed("Hi <tool") == [{"content": "Hi"}]
    assert session.feed("box") == [{"content": " <toolbox"}]
    assert session.feed(" <thi") == []
    assert session.feed("nk>x</think>y") == [{"reasoning_content": "x"}, {"content": "y"}]


def test_openai_message_shape():
    name, options, text, _ = CASES["qwen3-reasoning-content-two-calls"]
    session = _session(name, **options)
    session.feed(text)
    result = session.finish()
    assert result.finish_reason == "tool_calls"
    assert result.message() == {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "Two cities, two calls.",
        "tool_calls": [
            {
                "id": f"call{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": city})},
            }
            for i, city in enumerate(["Paris", "Rome"])
        ],
    }
    only_calls = _session("Qwen-Qwen2.5-7B-Instruct")
    only_calls.feed(HERMES_CALLS)
    assert only_calls.finish().message()["content"] is None
    plain = _session("Qwen-Qwen2.5-7B-Instruct")
    assert plain.finish().message() == {"role": "assistant", "content": ""}
    assert plain.finish().finish_reason is None


def test_generated_ids_are_unique_and_mistral_ids_fit_its_template():
    session = ChatSession(_template("Mistral-Small-3.2-24B-Instruct-2506"), None, USER, TOOLS)
    session.feed('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')
    session.feed('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}')
    ids = [c["id"] for c in session.finish().tool_calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    qwen = ChatSession(_template("Qwen-Qwen3-0.6B"), None, USER, TOOLS)
    qwen.feed(HERMES_CALLS)
    ids = [c["id"] for c in qwen.finish().tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Qwen-Qwen3-0.6B", ("hermes", "<think>")),
        ("Qwen-QwQ-32B", ("hermes", "<think>")),
        ("Qwen-Qwen2.5-7B-Instruct", ("hermes", None)),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", ("hermes", None)),
        ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", ("hermes", None)),
        ("meta-llama-Llama-3.1-8B-Instruct", ("llama3-json", None)),
        ("meta-llama-Llama-3.3-70B-Instruct", ("llama3-json", None)),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", ("deepseek", "<think>")),
        ("deepseek-ai-DeepSeek-V3.1", ("deepseek", "<think>")),
        ("mistralai-Mistral-Nemo-Instruct-2407", ("mistral", None)),
        ("Mistral-Small-3.2-24B-Instruct-2506", ("mistral", None)),
        ("mistralai-Ministral-3-14B-Reasoning-2512", ("mistral", "[THINK]")),
        # XML arguments inside <tool_call>: not the Hermes JSON syntax
        ("Qwen3-Coder", (None, None)),
        ("GLM-4.6", (None, "<think>")),
        ("google-gemma-2-2b-it", (None, None)),
    ],
)
def test_format_detected_from_template(name, expected):
    fmt = detect_chat_format((TEMPLATE_DIR / f"{name}.jinja").read_text())
    syntax = fmt.tool_syntax.name if fmt.tool_syntax else None
    assert (syntax, fmt.reasoning.start if fmt.reasoning else None) == expected


HISTORY = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "a1b2c3d4e",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "18C"},
]


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("Qwen-Qwen3-0.6B", {}),
        ("Qwen-Qwen3-0.6B", {"enable_thinking": False}),
        ("Qwen-Qwen2.5-7B-Instruct", {}),
        ("Qwen-QwQ-32B", {}),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", {}),
        ("meta-llama-Llama-3.1-8B-Instruct", {}),
        ("mistralai-Mistral-Nemo-Instruct-2407", {}),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", {"enable_thinking": True}),
    ],
)
def test_prompt_matches_transformers(name, kwargs):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    source = (TEMPLATE_DIR / f"{name}.jinja").read_text()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=source,
        bos_token="<s>",
        eos_token="</s>",
    )
    # the server receives arguments as OpenAI sends them: JSON text, which templates that
    # apply tojson would quote twice unless the session hands them the object
    openai_history = copy.deepcopy(HISTORY)
    call = openai_history[2]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps(call["arguments"])
    expected = hf.apply_chat_template(
        HISTORY,
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )
    session = ChatSession(
        ChatTemplate(source, "<s>", "</s>"),
        None,
        openai_history,
        tools=TOOLS,
        template_kwargs=kwargs,
    )
    assert session.prompt() == expected
    assert session.prompt().count('"city": "Paris"') == 1
    assert '\\"city\\"' not in session.prompt()  # arguments never quoted twice


def test_tool_choice_none_keeps_tools_out_of_the_prompt():
    with_tools = _session("Qwen-Qwen3-0.6B").prompt()
    without = _session("Qwen-Qwen3-0.6B", tool_choice="none").prompt()
    assert "<tools>" in with_tools and "<tools>" not in without
    assert without == _session("Qwen-Qwen3-0.6B", tools=None).prompt()


def test_bad_options_are_refused_with_the_way_out():
    with pytest.raises(ChatRequestError, match="reasoning_format 'r1'.*auto"):
        _session("Qwen-Qwen3-0.6B", reasoning_format="r1")
    with pytest.raises(ChatRequestError, match="tool_choice 'any'.*required"):
        _session("Qwen-Qwen3-0.6B", tool_choice="any")
    with pytest.raises(ChatRequestError, match="not a function tool.*parameters"):
        _session("Qwen-Qwen3-0.6B", tools=[{"type": "function", "name": "get_weather"}])
    with pytest.raises(ChatRequestError, match="not a function tool"):
        _session("Qwen-Qwen3-0.6B", tools="get_weather")


def test_model_without_template_gets_a_clear_error_on_chat():
    assert not has_own_chat_template({"general.architecture": "llama"})
    assert not has_own_chat_template({"tokenizer.chat_template": ""})
    assert has_own_chat_template({"tokenizer.chat_template": "{{ messages }}"})
    with pytest.raises(NoChatTemplateError, match="no chat template.*--chat-template") as info:
        chat_template({"general.architecture": "llama"})
    assert isinstance(info.value, TesseraError)
    override = chat_template({}, override="{{ messages[0]['content'] }}")
    assert override.render([{"role": "user", "content": "x"}]) == "x"
    own = chat_template({"tokenizer.chat_template": "{{ bos_token }}!"}, bos_token="<s>")
    assert own.render([]) == "<s>!"


def test_a_long_json_answer_streams_before_its_closing_brace():
    text = CASES["llama3-long-json-answer-streams"][2]
    session = _session("meta-llama-Llama-3.1-8B-Instruct")
    early = [d for ch in text[:-10] for d in session.feed(ch)]
    assert joined(early, "content") == text[:-10]


class _FunctoolsSyntax(ToolCallSyntax):
    """A family the core does not know: ``functools[{"name": ..., "arguments": ...}]``."""

    name = "functools"
    start_markers = ("functools",)

    def matches(self, template_source):
        return "functools[" in template_source

    def find_end(self, body):
        end = json_value_end(body)
        return None if end is None else max(end, 0)

    def parse(self, body, tool_names):
        try:
            calls = json.loads(body)
            return [(c["name"], json.dumps(c["arguments"]), None) for c in calls]
        except (ValueError, KeyError, TypeError):
            return None


def test_an_added_syntax_is_detected_and_parsed():
    template = ChatTemplate("{{ messages[0]['content'] }} Call tools as functools[...]:")
    assert detect_chat_format(template.source).tool_syntax is None
    fmt = detect_chat_format(template.source, syntaxes=(_FunctoolsSyntax(), *BUILTIN_SYNTAXES))
    assert fmt.tool_syntax.name == "functools"
    session = ChatSession(template, fmt, USER, TOOLS, id_factory=lambda: "call0")
    text = 'Sure. functools[{"name": "get_weather", "arguments": {"city": "Paris"}}] functoolsX'
    deltas = [d for ch in text for d in session.feed(ch)]
    result = session.finish()
    assert result.parts == [TextPart("Sure."), weather_call("Paris", 0), TextPart("functoolsX")]
    assert joined(deltas + result.deltas, "content") == "Sure.functoolsX"


def test_template_that_joins_argument_strings_gets_them_as_sent():
    """DeepSeek-R1-Distill-Llama adds the arguments to strings: the object fails, text works.

    (transformers cannot render this template with the null content it needs, so the oracle
    is the call text the template writes.)
    """
    history = copy.deepcopy(HISTORY)
    history[2]["content"] = None
    template = _template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
    with pytest.raises(ChatTemplateError):
        template.render(history)  # arguments as an object
    history[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"city": "Paris"})
    prompt = ChatSession(template, None, history, tools=TOOLS).prompt()
    assert (
        "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>'
    ) in prompt

"""Chat templates: every real template in tests/data/chat-templates renders a tool-using chat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.errors import TesseraError
from tessera.text.chat_template import (
    DEFAULT_CHATML,
    ChatTemplate,
    ChatTemplateError,
    ChatTemplateRejected,
    template_for,
)

TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
TEMPLATES = sorted(TEMPLATE_DIR.glob("*.jinja"))

SYSTEM = "You are a terse assistant."
QUESTION = "What is the weather in Paris?"
TOOL_RESULT = "18 degrees and sunny"
ANSWER = "It is 18 degrees and sunny."
FOLLOW_UP = "Thanks, and tomorrow?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]


def _conversation(arguments_as_string: bool, system_role: bool) -> list[dict]:
    """System, user, assistant tool call, tool result, assistant answer, user follow-up.

    Templates disagree on the shape of tool-call arguments (a dict or a JSON string, as the
    caller gave them) and on whether a system role exists; the variants cover both.
    """
    arguments: object = {"city": "Paris"}
    if arguments_as_string:
        arguments = json.dumps(arguments)
    call = {
        "id": "call00001",
        "type": "function",  # 9 alphanumerics: Mistral requires it
        "function": {"name": "get_weather", "arguments": arguments},
    }
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {
            "role": "tool",
            "tool_call_id": "call00001",
            "name": "get_weather",
            "content": TOOL_RESULT,
        },
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": FOLLOW_UP},
    ]
    if not system_role:
        messages = messages[1:]
        messages[0] = dict(messages[0], content=f"{SYSTEM}\n\n{QUESTION}")
    return messages


def _alternating() -> list[dict]:
    """The plainest chat: user/assistant turns only, for templates without tool roles."""
    return [
        {"role": "user", "content": f"{SYSTEM}\n\n{QUESTION}"},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": FOLLOW_UP},
    ]


def _render(template: ChatTemplate, messages: list[dict]) -> str:
    # firefunction-v2 reads its tool list and date from these extra template variables
    return template.render(
        messages,
        tools=TOOLS,
        add_generation_prompt=True,
        functions=json.dumps(TOOLS),
        datetime="2025-01-01",
    )


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.stem for p in TEMPLATES])
def test_real_template_renders_a_tool_conversation(path: Path) -> None:
    template = ChatTemplate(path.read_text(encoding="utf-8"), bos_token="<s>", eos_token="</s>")
    errors: list[str] = []
    for as_string, system_role in [(False, True), (True, True), (False, False), (True, False)]:
        messages = _conversation(as_string, system_role)
        original = json.dumps(messages)
        try:
            out = _render(template, messages)
        except ChatTemplateError as exc:  # this template wants the other shape
            errors.append(str(exc))
            continue
        assert json.dumps(messages) == original  # the caller's messages are left alone
        for text in (SYSTEM, QUESTION, TOOL_RESULT, FOLLOW_UP):
            assert text in out
        return
    # Only templates that refuse tool and system roles outright get the plain chat, and they
    # must have said so through raise_exception.
    assert any("rejected the conversation" in e for e in errors), errors
    out = _render(template, _alternating())
    for text in (SYSTEM, QUESTION, ANSWER, FOLLOW_UP):
        assert text in out


def test_gemma2_rejects_a_system_role_through_raise_exception() -> None:
    template = ChatTemplate((TEMPLATE_DIR / "google-gemma-2-2b-it.jinja").read_text())
    with pytest.raises(ChatTemplateRejected, match="System role not supported"):
        template.render(_conversation(False, True))


def test_chatml_output_is_exact() -> None:
    template = ChatTemplate((TEMPLATE_DIR / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."},
    ]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages) == expected
    assert ChatTemplate(DEFAULT_CHATML).render(messages) == expected
    assert ChatTemplate(DEFAULT_CHATML).render(messages, add_generation_prompt=False) == (
        expected.removesuffix("<|im_start|>assistant\n")
    )


def test_default_chatml_renders_text_parts() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "b"},
            ],
        }
    ]
    assert ChatTemplate(DEFAULT_CHATML).render(messages, add_generation_prompt=False) == (
        "<|im_start|>user\nab<|im_end|>\n"
    )


def test_template_for_falls_back_to_chatml() -> None:
    assert template_for({}).source == DEFAULT_CHATML
    assert template_for({"tokenizer.chat_template": "{{ bos_token }}x"}, "<s>").render([]) == "<s>x"


def test_tojson_has_hf_semantics() -> None:
    value = {"b": "é", "a": [1, 2]}
    render = ChatTemplate
    assert render("{{ v | tojson }}").render([], v=value) == '{"b": "é", "a": [1, 2]}'
    assert render("{{ v | tojson(sort_keys=true) }}").render([], v=value) == (
        '{"a": [1, 2], "b": "é"}'
    )
    assert render("{{ v | tojson(indent=2) }}").render([], v={"a": 1}) == '{\n  "a": 1\n}'
    assert render("{{ v | tojson(separators=[',', ':']) }}").render([], v=value) == (
        '{"b":"é","a":[1,2]}'
    )
    assert render("{{ v | map(attribute='n') | tojson }}").render([], v=[{"n": 1}]) == "[1]"


def test_template_helpers() -> None:
    assert ChatTemplate("{{ strftime_now('%Y') | length }}").render([]) == "4"
    src = (
        "{% for k, v in d.items() %}{% if k == 'skip' %}{% continue %}{% endif %}{{ k }}"
        "{% endfor %}"
    )
    assert ChatTemplate(src).render([], d={"a": 1, "skip": 2, "b": 3}) == "ab"
    assert ChatTemplate("{% generation %}x{% endgeneration %}").render([]) == "x"
    assert ChatTemplate("{{ s | from_json | tojson }}").render([], s='{"a": 1}') == '{"a": 1}'


def test_list_pop_works_on_a_copy_of_the_callers_data() -> None:
    ids = ["a", "b"]
    assert ChatTemplate("{{ ids.pop(0) }}{{ ids | length }}").render([], ids=ids) == "a1"
    assert ids == ["a", "b"]


def test_template_errors_are_tessera_errors() -> None:
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="failed while rendering"):
        ChatTemplate("{{ messages[0].content.nope() }}").render([{"role": "user", "content": 1}])
    with pytest.raises(TesseraError, match="rejected the conversation: no"):
        ChatTemplate("{{ raise_exception('no') }}").render([])
    with pytest.raises(ChatTemplateError, match="unsafe|failed while rendering"):
        ChatTemplate("{{ d.update({'a': 1}) }}").render([], d={})

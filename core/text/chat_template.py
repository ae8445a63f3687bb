"""Chat templates: turn a list of OpenAI-style messages into the prompt text a model expects.

Models ship a Jinja template (GGUF key ``tokenizer.chat_template``, or ``chat_template`` in a
Hugging Face tokenizer_config.json). :class:`ChatTemplate` renders it the way Hugging Face
``transformers`` does — a sandboxed Jinja2 environment with ``trim_blocks``/``lstrip_blocks``,
the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now``, HF's ``tojson`` and the
``{% generation %}`` block, plus ``from_json`` as llama.cpp's template engine has it — so that a
prompt built here matches the one the model was trained on.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tessera.errors import TesseraError

#: Used when a model has no chat template of its own (ChatML, as llama.cpp falls back to).
DEFAULT_CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{- message['content'] }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for part in message['content'] if part['type'] == 'text' -%}{{- part['text'] }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' }}{%- endif -%}"
)


class ChatTemplateError(TesseraError):
    """A chat template does not parse or fails while rendering."""


class ChatTemplateRejected(ChatTemplateError):
    """The template itself refused the conversation (its ``raise_exception`` was called)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateRejected(
        f"the model's chat template rejected the conversation: {message}; change the "
        "messages (roles, order) or pass a different --chat-template"
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _json_default(value: Any) -> Any:
    # filters such as map() yield generators; serialize them as the lists they stand for
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping)):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: Sequence[str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    # HF's tojson: unlike Jinja's own, it keeps non-ASCII text and does not HTML-escape
    return json.dumps(
        value,
        indent=indent,
        separators=tuple(separators) if separators else None,
        sort_keys=sort_keys,
        ensure_ascii=ensure_ascii,
        default=_json_default,
    )


def _from_json(text: str) -> Any:
    return json.loads(text)


class _GenerationExtension(Extension):
    """``{% generation %}...{% endgeneration %}``: marks assistant text for training masks.

    Rendering a prompt needs only the text inside, so the block renders its body unchanged.
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _ChatEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, except that templates may pop/append on lists.

    Some templates (Kimi K2) keep a queue of tool-call ids in a list; render() passes deep
    copies of the caller's data, so the caller never sees a change.
    """

    _LIST_MUTATORS = frozenset({"pop", "append"})

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, list) and attr in self._LIST_MUTATORS:
            return True
        return super().is_safe_attribute(obj, attr, value)


def _environment() -> jinja2.Environment:
    env = _ChatEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationExtension],
    )
    env.filters["tojson"] = _tojson
    env.filters["from_json"] = _from_json
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template; ``render`` it with messages, tools and template variables."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"the chat template does not parse (line {exc.lineno}: {exc.message}); fix the "
                "template or pass a different one"
            ) from exc

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``), ending with the assistant's cue."""
        variables: dict[str, Any] = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **copy.deepcopy(extra),
            "messages": copy.deepcopy(messages),
            "tools": copy.deepcopy(tools),
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(
                f"the chat template failed while rendering ({type(exc).__name__}: {exc}); check "
                "the messages' shape or pass a different template"
            ) from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # a template indexing or adding the wrong types surfaces as plain Python errors
            raise ChatTemplateError(
                f"the chat template failed while rendering ({type(exc).__name__}: {exc}); check "
                "the messages' shape or pass a different template"
            ) from exc


def template_for(
    metadata: Mapping[str, Any], bos_token: str = "", eos_token: str = ""
) -> ChatTemplate:
    """The model's own template from its metadata, or ChatML when it has none."""
    source = metadata.get("tokenizer.chat_template") or DEFAULT_CHATML
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)

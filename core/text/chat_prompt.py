"""A model's chat template and the tokens of a rendered chat prompt.

``tessera run --chat``, ``tessera chat`` and :class:`tessera.LLM` build their prompts
this way: the model's own template (ChatML when it has none, as llama.cpp falls back to)
with its BOS and EOS pieces, and the rendered text encoded with special tokens parsed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # jinja2 is imported when a template is made, not by a plain prompt's run
    from tessera.text.chat_template import ChatTemplate


def _piece(tokenizer: Any, token_id: int | None) -> str:
    return tokenizer.token_to_piece(token_id) if token_id is not None else ""


def model_chat_template(tokenizer: Any, override: str | None = None) -> ChatTemplate:
    """``override`` (a template's source), else the model's own template, else ChatML."""
    from tessera.text.chat_template import DEFAULT_CHATML, ChatTemplate

    source = override or tokenizer.chat_template or DEFAULT_CHATML
    return ChatTemplate(
        source, _piece(tokenizer, tokenizer.bos_id), _piece(tokenizer, tokenizer.eos_id)
    )


def encode_chat_prompt(tokenizer: Any, text: str) -> list[int]:
    """Tokens of a rendered chat prompt: special tokens parsed, and the tokenizer's BOS
    added unless the template already wrote it (no double BOS)."""
    bos = _piece(tokenizer, tokenizer.bos_id)
    add_special = not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special=add_special, parse_special=True)

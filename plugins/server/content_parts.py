"""Message content given as an array of parts (OpenAI's form), made plain text for a
chat template.

Text parts are joined with a newline, as llama-server joins them for a template that
takes text; a part of an unknown type is skipped, as llama-server skips it. Images and
audio need an encoder these models do not have, so they are refused (400) rather than
silently dropped.
"""

from __future__ import annotations

from typing import Any

from tessera.contract.routes import ApiError

#: Part types that carry media, and the encoder each would need.
_MEDIA = {"image_url": "vision", "input_image": "vision", "input_audio": "audio"}


def no_encoder(kind: str) -> ApiError:
    return ApiError(
        400,
        f"this model has no {kind} encoder, so it cannot read {kind} input; send the "
        "message as text only",
        "messages",
    )


def _text(content: list[Any]) -> str:
    texts = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ApiError(400, "each content part must be an object with a 'type'", "messages")
        kind = part["type"]
        if kind in _MEDIA:
            raise no_encoder(_MEDIA[kind])
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ApiError(400, "a text content part needs a 'text' string", "messages")
            texts.append(part["text"])
    return "\n".join(texts)


def plain_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every array ``content`` joined into text (the list itself when
    none is an array); Ollama's ``images`` are refused like image parts."""
    out = []
    for message in messages:
        if message.get("images"):
            raise no_encoder("vision")
        if isinstance(message.get("content"), list):
            message = {**message, "content": _text(message["content"])}
        out.append(message)
    return out

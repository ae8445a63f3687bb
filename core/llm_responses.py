"""The OpenAI-shaped dicts :class:`tessera.LLM` returns, as llama-cpp-python returns them.

``complete`` gives a ``text_completion`` (``openai.types.Completion``), ``chat`` a
``chat.completion`` (``openai.types.chat.ChatCompletion``); streamed, they are
``text_completion`` chunks (a Completion whose ``finish_reason`` is null until the last) and
``chat.completion.chunk`` dicts (``ChatCompletionChunk``: the role first, then content
deltas, then an empty delta with the finish reason).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import attrs

from tessera.errors import TesseraError


@attrs.define
class RunTotals:
    """What one generation used and why it ended (OpenAI's ``usage`` and ``finish_reason``)."""

    n_prompt: int = 0
    n_completion: int = 0
    finish_reason: str = "length"
    #: The generation was closed before its end (a later call on the same LLM).
    cut: bool = False

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.n_prompt,
            "completion_tokens": self.n_completion,
            "total_tokens": self.n_prompt + self.n_completion,
        }


@attrs.frozen
class Response:
    """The id, creation time and model name every dict of one response shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> Response:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(self, text: str, totals: RunTotals) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": totals.finish_reason}
        return {**self._head("text_completion"), "choices": [choice], "usage": totals.usage()}

    def completion_chunk(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def chat_completion(self, content: str, totals: RunTotals) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": totals.finish_reason,
        }
        return {**self._head("chat.completion"), "choices": [choice], "usage": totals.usage()}

    def chat_chunk(self, delta: dict[str, str], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}


def completion_chunks(
    response: Response, pieces: Iterator[str], totals: RunTotals
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed completion: one per text piece, then the finish reason."""
    for text in pieces:
        yield response.completion_chunk(text)
    _check_not_cut(totals)
    yield response.completion_chunk("", totals.finish_reason)


def chat_chunks(
    response: Response, pieces: Iterator[str], totals: RunTotals
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed chat answer: the role, the content pieces, the finish."""
    yield response.chat_chunk({"role": "assistant", "content": ""})
    for text in pieces:
        yield response.chat_chunk({"content": text})
    _check_not_cut(totals)
    yield response.chat_chunk({}, totals.finish_reason)


def _check_not_cut(totals: RunTotals) -> None:
    if totals.cut:
        raise TesseraError(
            "this stream was closed because a later call on the same LLM started a new "
            "generation; read a stream to its end before the next call"
        )

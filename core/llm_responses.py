"""The OpenAI-shaped dicts :class:`tessera.LLM` returns, as llama-cpp-python returns them.

``complete`` gives a ``text_completion`` (``openai.types.Completion``), ``chat`` a
``chat.completion`` (``openai.types.chat.ChatCompletion``); streamed, they are
``text_completion`` chunks (a Completion whose ``finish_reason`` is null until the last) and
``chat.completion.chunk`` dicts (``ChatCompletionChunk``: the role first, then content
deltas, then an empty delta with the finish reason). With logprobs asked for, a choice's
``logprobs`` is the server's (:mod:`tessera.engine.logprobs`); in a stream each chunk
carries the entries of the tokens drawn since the previous one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import attrs

from tessera.engine.logprobs import chat_logprob_entry, completion_logprobs
from tessera.engine.slot_types import TokenEvent
from tessera.errors import TesseraError


@attrs.define
class RunTotals:
    """What one generation used and why it ended (OpenAI's ``usage`` and ``finish_reason``)."""

    n_prompt: int = 0
    n_completion: int = 0
    finish_reason: str = "length"
    #: The generation was closed before its end (a later call on the same LLM).
    cut: bool = False
    #: Each generated token's logprobs, when they were asked for (None: not asked).
    events: list[TokenEvent] | None = None
    #: How many of :attr:`events` a stream has sent, and the text offset they reach.
    n_sent: int = 0
    offset: int = 0

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
    #: The model's tokenizer (token texts and bytes of the logprobs).
    tokenizer: Any = attrs.field(default=None, eq=False, repr=False)

    @classmethod
    def new(cls, prefix: str, model: str, tokenizer: Any = None) -> Response:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model, tokenizer)

    def _logprobs(self, kind: str, totals: RunTotals, upto: int | None = None) -> Any:
        """The ``logprobs`` of all tokens (``upto`` None), or of those a stream has not sent
        before ``upto``, in the ``kind`` of shape (``chat``, ``completion``); None when they
        were not asked for."""
        if totals.events is None:
            return None
        events = totals.events[totals.n_sent : upto]
        if upto is not None:  # a chunk: None when no token came since the last one
            if not events:
                return None
            totals.n_sent += len(events)
        if kind == "chat":
            return {"content": [chat_logprob_entry(self.tokenizer, e) for e in events]}
        found = completion_logprobs(self.tokenizer, events, totals.offset)
        if upto is not None and found["tokens"]:
            totals.offset = found["text_offset"][-1] + len(found["tokens"][-1])
        return found

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(self, text: str, totals: RunTotals) -> dict[str, Any]:
        choice = {
            "text": text,
            "index": 0,
            "logprobs": self._logprobs("completion", totals),
            "finish_reason": totals.finish_reason,
        }
        return {**self._head("text_completion"), "choices": [choice], "usage": totals.usage()}

    def completion_chunk(
        self, text: str, totals: RunTotals, finish_reason: str | None = None
    ) -> dict[str, Any]:
        """A chunk with the logprobs of the tokens drawn since the previous chunk."""
        logprobs = self._logprobs("completion", totals, len(totals.events or ()))
        choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def chat_completion(self, content: str, totals: RunTotals) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "logprobs": self._logprobs("chat", totals),
            "finish_reason": totals.finish_reason,
        }
        return {**self._head("chat.completion"), "choices": [choice], "usage": totals.usage()}

    def chat_chunk(
        self, delta: dict[str, str], totals: RunTotals, finish_reason: str | None = None
    ) -> dict[str, Any]:
        """A chunk with the logprobs of the tokens drawn since the previous chunk."""
        logprobs = self._logprobs("chat", totals, len(totals.events or ()))
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}


def completion_chunks(
    response: Response, pieces: Iterator[str], totals: RunTotals
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed completion: one per text piece, then the finish reason."""
    for text in pieces:
        yield response.completion_chunk(text, totals)
    _check_not_cut(totals)
    yield response.completion_chunk("", totals, totals.finish_reason)


def chat_chunks(
    response: Response, pieces: Iterator[str], totals: RunTotals
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed chat answer: the role, the content pieces, the finish."""
    yield response.chat_chunk({"role": "assistant", "content": ""}, totals)
    for text in pieces:
        yield response.chat_chunk({"content": text}, totals)
    _check_not_cut(totals)
    yield response.chat_chunk({}, totals, totals.finish_reason)


def _check_not_cut(totals: RunTotals) -> None:
    if totals.cut:
        raise TesseraError(
            "this stream was closed because a later call on the same LLM started a new "
            "generation; read a stream to its end before the next call"
        )

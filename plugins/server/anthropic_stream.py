"""Anthropic's stream of a /v1/messages answer: server-sent events, each named by its
``event:`` line, in Anthropic's order: message_start, then per content block
content_block_start, content_block_delta (text_delta, thinking_delta, input_json_delta) and
content_block_stop, then message_delta (stop_reason, usage) and message_stop."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from tessera.contract.routes import ApiError

from .generation import ChoiceRun, run_error


def event(data: dict[str, Any]) -> bytes:
    body = json.dumps(data, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {body}\n\n".encode()


class _Blocks:
    """The content blocks of one answer as they open, grow and close."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block now open
        self.called = False

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return [*out, event({"type": "content_block_start", "index": self.index,
                             "content_block": block})]  # fmt: skip

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # the SDK's thinking block carries a signature
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        return [*out, event({"type": "content_block_stop", "index": self.index})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def feed(self, deltas: list[dict[str, Any]]) -> list[bytes]:
        """OpenAI deltas from the chat session as Anthropic's block events."""
        out: list[bytes] = []
        for d in deltas:
            if d.get("reasoning_content"):
                if self.open != "thinking":
                    out += self._start({"type": "thinking", "thinking": "", "signature": ""})
                out.append(self._delta({"type": "thinking_delta",
                                        "thinking": d["reasoning_content"]}))  # fmt: skip
            if d.get("content"):
                if self.open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": d["content"]}))
            for call in d.get("tool_calls") or ():
                fn = call.get("function") or {}
                if call.get("id"):  # a new call: its own block
                    self.called = True
                    out += self._start({"type": "tool_use", "id": call["id"],
                                        "name": fn.get("name", ""), "input": {}})  # fmt: skip
                if fn.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta",
                                            "partial_json": fn["arguments"]}))  # fmt: skip
        return out


async def events(
    head: dict[str, Any],
    n_prompt: int,
    run: ChoiceRun,
    session: Any,
    stop_reason: Callable[[ChoiceRun, bool], str],
    error_body: Callable[[ApiError], dict[str, Any]],
) -> AsyncIterator[bytes]:
    """The whole stream of one run; leaving early (a disconnect) cancels it."""
    blocks = _Blocks()
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": n_prompt, "output_tokens": 0}}  # fmt: skip
    try:
        yield event({"type": "message_start", "message": start})
        async for piece in run.pieces():
            for data in blocks.feed(session.feed(piece.text)):
                yield data
        if (error := run_error(run)) is not None:
            yield event(error_body(error))
            return
        for data in blocks.feed(session.finish().deltas) + blocks.close():
            yield data
        delta = {"stop_reason": stop_reason(run, blocks.called),
                 "stop_sequence": run.stopping_word or None}  # fmt: skip
        usage = {"input_tokens": run.finish.n_prompt, "output_tokens": run.finish.n_generated}
        yield event({"type": "message_delta", "delta": delta, "usage": usage})
        yield event({"type": "message_stop"})
    finally:
        run.cancel()

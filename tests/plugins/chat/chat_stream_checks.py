"""What every answer parser's streaming tests check: the deltas a session streams for a
split of the text add up to the parts it gives at the end, and no marker leaks."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from tessera.plugins.chat.session import ChatSession, ToolCallPart


def weather_call(city: str, i: int = 0) -> ToolCallPart:
    """The ``i``-th call of the test tool ``get_weather`` for ``city``."""
    return ToolCallPart(id=f"call{i}", name="get_weather", arguments=json.dumps({"city": city}))


def stream(session: ChatSession, pieces: Iterable[str]) -> tuple[list[dict], Any]:
    """Every delta of ``pieces`` fed one by one, then the finish's, and the result."""
    deltas = [d for piece in pieces for d in session.feed(piece)]
    result = session.finish()
    return deltas + result.deltas, result


def joined(deltas: Iterable[dict], key: str) -> str:
    return "".join(d[key] for d in deltas if key in d)


def check_streamed(deltas: list[dict], result: Any, parts: list, markers: Sequence[str]) -> None:
    """The parts are ``parts``; the streamed content, reasoning and tool calls (indexed in
    order) are the result's; a marker reaches the client only where a part kept the
    answer's own text with it (a call that did not parse, a tag inside reasoning)."""
    assert result.parts == parts
    assert joined(deltas, "content") == (result.content or "")
    assert joined(deltas, "reasoning_content") == (result.reasoning_content or "")
    streamed_calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c.pop("index") for c in streamed_calls] == list(range(len(streamed_calls)))
    assert streamed_calls == (result.tool_calls or [])
    own = {m for m in markers for p in parts if not isinstance(p, ToolCallPart) and m in p.text}
    for delta in deltas:
        for key in ("content", "reasoning_content"):
            assert {m for m in markers if m in delta.get(key, "")} <= own

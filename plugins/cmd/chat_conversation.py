"""The conversation of ``tessera chat``: an optional system message and the turns after it,
saved and loaded as JSON (``{"messages": [...]}``, OpenAI's message shape)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from tessera.errors import TesseraError

ROLES = ("system", "user", "assistant")


@attrs.define
class Conversation:
    """The messages a chat template renders, kept as plain OpenAI dicts."""

    system: str | None = None
    turns: list[dict[str, str]] = attrs.field(factory=list)

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.turns

    def clear(self) -> None:
        """Forget the turns; the system message stays."""
        self.turns = []

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write ``{"messages": [...]}`` to ``path`` atomically: a temporary file in the same
        folder, then a rename, so a crash never leaves half a file where the old one was."""
        path = Path(path)
        if not path.parent.is_dir():
            raise TesseraError(f"cannot save to '{path}': folder '{path.parent}' does not exist")
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"messages": self.messages()}, f, ensure_ascii=False, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Conversation:
        """The conversation saved in ``path`` (by :meth:`save`, or any ``{"messages": [...]}``
        or bare list of ``{"role", "content"}`` dicts with string contents)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise TesseraError(f"cannot read '{path}' ({exc.strerror}); check the path") from None
        except ValueError as exc:
            raise TesseraError(f"'{path}' is not JSON ({exc}); load a file /save wrote") from None
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list) or not all(_is_message(m) for m in messages):
            raise TesseraError(
                f"'{path}' holds no list of messages; each must be "
                '{"role": "system"|"user"|"assistant", "content": "..."} (as /save writes)'
            )
        turns = [{"role": m["role"], "content": m["content"]} for m in messages]
        system = None
        if turns and turns[0]["role"] == "system":
            system = turns.pop(0)["content"]
        return cls(system, turns)


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)

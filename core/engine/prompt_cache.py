"""Prompt states kept beside the slots, so a slot can be reused without losing its cache.

When the slot engine gives a slot to a request that shares little with what the slot
holds, the tokens it would overwrite are first saved here (a context state file per
entry, under a byte budget, least recently used out first). A later request whose prompt
shares a longer prefix with a stored entry than with any slot gets that entry restored
into its slot and evaluates only the rest: llama.cpp's host-memory prompt cache.

Entries are files in a private temporary directory (the OS page cache keeps recent ones
in memory); they die with the store.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.errors import TesseraError

log = logging.getLogger("tessera.slots")

#: Fewer tokens than this are not worth a file.
MIN_TOKENS = 16


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


@attrs.define
class StoredPrompt:
    tokens: tuple[int, ...]
    path: Path
    n_bytes: int
    last_used: float


class PromptStore:
    """Saved sequence states by token prefix, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._dir = tempfile.TemporaryDirectory(prefix="tessera-prompts-")
        self.entries: list[StoredPrompt] = []
        self._n_files = 0

    @property
    def n_bytes(self) -> int:
        return sum(e.n_bytes for e in self.entries)

    def close(self) -> None:
        self.entries.clear()
        self._dir.cleanup()

    def save(self, ctx: Any, seq_id: int, tokens: Sequence[int]) -> bool:
        """Keep sequence ``seq_id``'s state (it holds ``tokens``); False if not worth it
        or over the budget."""
        tokens = tuple(tokens)
        if len(tokens) < MIN_TOKENS or any(e.tokens[: len(tokens)] == tokens for e in self.entries):
            return False  # too short, or an entry already covers it
        self._n_files += 1
        path = Path(self._dir.name) / f"prompt-{self._n_files}.state"
        ctx.save_state(path, seq_id=seq_id, tokens=tokens)
        entry = StoredPrompt(tokens, path, path.stat().st_size, time.monotonic())
        if entry.n_bytes > self.budget_bytes:
            path.unlink()
            return False
        # entries this one extends are now redundant
        for old in [e for e in self.entries if tokens[: len(e.tokens)] == e.tokens]:
            self._drop(old)
        self.entries.append(entry)
        while self.n_bytes > self.budget_bytes:
            self._drop(min(self.entries, key=lambda e: e.last_used))
        return True

    def best(self, prompt: Sequence[int]) -> tuple[StoredPrompt | None, int]:
        """The entry sharing the longest prefix with ``prompt``, and that length."""
        best, best_n = None, 0
        for e in self.entries:
            n = common_prefix(e.tokens, prompt)
            if n > best_n:
                best, best_n = e, n
        return best, best_n

    def restore(self, ctx: Any, seq_id: int, entry: StoredPrompt) -> list[int] | None:
        """Load ``entry`` into sequence ``seq_id``; None (context unchanged) if it cannot."""
        try:
            tokens = ctx.load_state(entry.path, seq_id=seq_id)
        except TesseraError as exc:
            log.info("prompt store: cannot restore %d tokens: %s", len(entry.tokens), exc)
            return None
        entry.last_used = time.monotonic()
        return tokens

    def _drop(self, entry: StoredPrompt) -> None:
        self.entries.remove(entry)
        entry.path.unlink(missing_ok=True)

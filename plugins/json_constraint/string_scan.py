"""Vectorised check of every token against the inside of a JSON string.

Inside a string nearly every token is valid, so walking the vocabulary trie byte by byte in
Python costs seconds on a 150k-token vocabulary. String contents need no stack: the parser's
string modes (plain, escape, ``\\uXXXX``, pending UTF-8 bytes) form a small DFA. This module
derives that DFA from :class:`tessera.plugins.json_constraint.prefix.JsonPrefix` itself (so the
grammar lives in one place), then runs all tokens through it at once with numpy, one byte column at
a time.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from tessera.plugins.json_constraint.prefix import ESCAPE, STRING, UNICODE, UTF8, JsonPrefix

STRING_MODES = frozenset((STRING, UTF8, ESCAPE, UNICODE))


@attrs.frozen
class StringScan:
    """Tokens checked from one string state: ``valid`` ids stay in the string or close it at
    their last byte; ``closers`` close it earlier, so the rest needs the full parser."""

    valid: np.ndarray  # token ids
    closers: np.ndarray  # token ids
    close_at: np.ndarray  # index just past the closing quote, per closer


class StringScanner:
    """The string DFA and the vocabulary as a byte matrix, built once per tokenizer."""

    def __init__(self, token_bytes: Sequence[bytes | None]) -> None:
        self.n_vocab = len(token_bytes)
        self._states: dict[tuple, int] = {}
        self._table = self._build_table()
        usable = [i for i, data in enumerate(token_bytes) if data]
        lengths = np.array([len(token_bytes[i]) for i in usable], dtype=np.int64)
        order = np.argsort(-lengths, kind="stable")
        self._ids = np.asarray(usable, dtype=np.int64)[order]
        self._lengths = lengths[order]
        width = int(self._lengths[0]) if len(usable) else 0
        self._bytes = np.zeros((len(usable), width), dtype=np.uint8)
        for row, i in enumerate(self._ids.tolist()):
            data = token_bytes[i]
            self._bytes[row, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        # Longest tokens first, so the tokens still running at column j are a prefix.
        self._row = np.full(self.n_vocab, -1, dtype=np.int64)
        self._row[self._ids] = np.arange(len(self._ids))
        self._scans: dict[tuple, StringScan] = {}

    @staticmethod
    def string_key(state: JsonPrefix) -> tuple:
        return state.mode, state.aux

    def _build_table(self) -> np.ndarray:
        """Transition table over string states; the last two rows are BAD and CLOSED."""
        start = JsonPrefix()
        start.feed(b'{"')
        start.is_key = False
        states, todo, rows = [start], [start], []
        self._states[self.string_key(start)] = 0
        while todo:
            state = todo.pop(0)
            row = []
            for b in range(256):
                nxt = state.copy()
                if not nxt.step(b):
                    row.append(-1)  # BAD
                elif nxt.mode not in STRING_MODES:
                    row.append(-2)  # CLOSED
                else:
                    key = self.string_key(nxt)
                    if key not in self._states:
                        self._states[key] = len(states)
                        states.append(nxt)
                        todo.append(nxt)
                    row.append(self._states[key])
            rows.append(row)
        n = len(states)
        self.bad, self.closed = n, n + 1
        table = np.array(rows + [[0] * 256, [0] * 256], dtype=np.int64)
        table[table == -1] = self.bad
        table[table == -2] = self.closed
        table[self.bad], table[self.closed] = self.bad, self.closed  # both absorb
        return table

    def scan(
        self, state: JsonPrefix, ids: Sequence[int] | None = None, offset: int = 0
    ) -> StringScan:
        """Tokens (all, or ``ids``) checked from their byte ``offset`` on, starting in
        ``state`` (which must be inside a string). Whole-vocabulary scans are cached."""
        key = self.string_key(state)
        if ids is None and key in self._scans:
            return self._scans[key]
        # Rows sorted by length, longest first, so the tokens still running are a prefix.
        rows = np.arange(len(self._ids)) if ids is None else np.sort(self._row[list(ids)])
        lengths = self._lengths[rows]
        width = int(lengths[0]) if len(rows) else 0
        active = np.searchsorted(-lengths, -np.arange(offset, width), side="left")
        current = np.full(len(rows), self._states[key], dtype=np.int64)
        close_at = np.zeros(len(rows), dtype=np.int64)
        for j, n in enumerate(active.tolist(), start=offset):
            before = current[:n]
            after = self._table[before, self._bytes[rows[:n], j]]
            close_at[:n][(after == self.closed) & (before != self.closed)] = j + 1
            current[:n] = after
        closed = current == self.closed
        ok = (current != self.bad) & (~closed | (close_at == lengths))
        early = closed & (close_at < lengths)
        ids_out = self._ids[rows]
        scan = StringScan(ids_out[ok], ids_out[early], close_at[early])
        if ids is None:
            self._scans[key] = scan
        return scan

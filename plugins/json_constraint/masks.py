"""Allowed-token masks for JSON-constrained sampling, one parser state at a time.

:class:`MaskBuilder` holds the vocabulary as a byte trie and (optionally) the vectorised
string scanner, and computes for a :class:`~tessera.plugins.json_constraint.prefix.JsonPrefix` state
which tokens keep it a valid prefix. The result is split so it can be cached per state key: tokens
whose validity the key decides, and tokens that pop below the stack entries the key records, which
the caller re-checks against each real state.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.plugins.json_constraint.prefix import AFTER, COLON, STRING, STRING_PLAIN, JsonPrefix
from tessera.plugins.json_constraint.string_scan import STRING_MODES, StringScanner

# Trie subtrees entering a string with at least this many tokens go to the numpy scan.
SCAN_MIN_TOKENS = 64


class _TrieNode:
    __slots__ = ("children", "ids", "_subtree")

    def __init__(self) -> None:
        self.children: dict[int, _TrieNode] = {}
        self.ids: list[int] = []  # tokens whose bytes end here
        self._subtree: list[int] | None = None

    def subtree(self) -> list[int]:
        if self._subtree is None:
            self._subtree = self.ids + [i for c in self.children.values() for i in c.subtree()]
        return self._subtree


class MaskBuilder:
    """The vocabulary trie (and string scanner) built once; ``entry`` per parser state key."""

    def __init__(self, token_bytes: Sequence[bytes | None], vector_strings: bool) -> None:
        """``token_bytes[i]`` is None for tokens never allowed inside JSON."""
        self.n_vocab = len(token_bytes)
        self.token_bytes = token_bytes
        self._root = _TrieNode()
        for i, data in enumerate(token_bytes):
            if data is not None:
                node = self._root
                for b in data:
                    child = node.children.get(b)
                    if child is None:
                        child = node.children[b] = _TrieNode()
                    node = child
                node.ids.append(i)
        self._strings = StringScanner(token_bytes) if vector_strings else None

    def entry(self, state: JsonPrefix) -> tuple[np.ndarray, np.ndarray]:
        """Valid tokens for the state's key, plus tokens that pop below what the key knows
        (their validity depends on deeper stack entries, so they are checked per state)."""
        valid = np.zeros(self.n_vocab, dtype=bool)
        dependent: list[int] = []
        floor = -1 if len(state.stack) <= 2 else len(state.stack) - 2
        if self._strings is not None and state.mode in STRING_MODES:
            self._string_tail(state, None, 0, floor, valid, dependent)
        else:
            self._walk_trie(state, floor, valid, dependent)
        return valid, np.asarray(dependent, dtype=np.int64)

    def _walk_trie(self, state: JsonPrefix, floor: int, valid: np.ndarray, dependent: list) -> None:
        """Depth-first over the vocabulary trie; a subtree is cut at its first invalid byte,
        and large subtrees that enter a string go to the vectorised string scan."""
        todo = [(self._root, state, 0)]
        while todo:
            node, st, depth = todo.pop()
            if len(st.stack) <= floor:
                for child in node.children.values():
                    dependent.extend(child.subtree())
                continue
            plain = st.mode == STRING
            for b, child in node.children.items():
                if plain and b in STRING_PLAIN:
                    nxt = st  # unchanged, and states on the stack are never mutated
                else:
                    nxt = st.copy()
                    if not nxt.step(b):
                        continue
                valid[child.ids] = True
                if not child.children:
                    continue
                if (
                    self._strings is not None
                    and nxt.mode in STRING_MODES
                    and len(child.subtree()) >= SCAN_MIN_TOKENS
                ):
                    below = [i for c in child.children.values() for i in c.subtree()]
                    self._string_tail(nxt, below, depth + 1, floor, valid, dependent)
                else:
                    todo.append((child, nxt, depth + 1))

    def _string_tail(
        self,
        state: JsonPrefix,
        ids: list[int] | None,
        offset: int,
        floor: int,
        valid: np.ndarray,
        dependent: list,
    ) -> None:
        """Check tokens (all, or ``ids``) from byte ``offset`` on, ``state`` being inside a
        string: the vectorised scan up to the closing quote, the parser after it."""
        scan = self._strings.scan(state, ids, offset)
        valid[scan.valid] = True
        closed = state.copy()
        closed.mode, closed.aux, closed.is_key = (COLON if state.is_key else AFTER), None, False
        for token, start in zip(scan.closers.tolist(), scan.close_at.tolist(), strict=True):
            st = closed.copy()
            for b in self.token_bytes[token][start:]:
                if len(st.stack) <= floor:
                    dependent.append(token)
                    break
                if not st.step(b):
                    break
            else:
                valid[token] = True

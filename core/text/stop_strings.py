"""Stop strings over streamed text: send what is safe now, hold back what may begin a stop.

Generated tokens arrive as detokenized pieces, and a stop string (OpenAI's ``stop``) may be cut
across them ("<|" then "end|>"). :class:`StopStringMatcher` returns, for each piece, the text
that can no longer be part of a stop string, keeps the longest end that may still begin one,
and reports the first stop string found; the text before it is the last to send and the stop
string itself is never sent. At the end of generation, :meth:`StopStringMatcher.flush` gives
back what was held.

It lives in the core, beside the stream decoder, because :class:`tessera.LLM` applies stop strings
as the server does; the server runs it before its chat parser, so a stop string ends the answer
before the chat layer sees it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from tessera.errors import TesseraError


def partial_suffix(text: str, markers: Collection[str]) -> int:
    """Length of the longest end of ``text`` that is a proper prefix of one of ``markers``."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


@attrs.frozen
class StopCheck:
    """What one piece gave: ``text`` is safe to send; ``stop`` is the stop string hit, if any."""

    text: str
    stop: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop is not None


class StopStringMatcher:
    """Feeds detokenized pieces; finds the first of ``stops`` in the whole stream."""

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            stops = [stops]
        if any(not isinstance(s, str) or not s for s in stops):
            raise TesseraError("stop strings must be non-empty strings; remove the empty one")
        self.stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self.stop: str | None = None

    def feed(self, piece: str) -> StopCheck:
        """The text now safe to send; after a stop string was hit, nothing more."""
        if self.stop is not None:
            return StopCheck("", self.stop)
        text = self._held + piece
        hits = [(text.find(s), s) for s in self.stops if s in text]
        if hits:
            # the stop completed first in the stream wins (whatever the split into pieces);
            # of two ending at the same place, the longer
            pos, stop = min(hits, key=lambda hit: (hit[0] + len(hit[1]), hit[0]))
            self._held = ""
            self.stop = stop
            return StopCheck(text[:pos], stop)
        hold = partial_suffix(text, self.stops)
        self._held = text[len(text) - hold :]
        return StopCheck(text[: len(text) - hold])

    def flush(self) -> str:
        """Generation ended without a stop string: the text still held back."""
        held, self._held = self._held, ""
        return held

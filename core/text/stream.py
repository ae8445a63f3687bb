"""Incremental detokenization for streaming: token ids in, complete UTF-8 text out."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

from tessera.text.vocab import TokenType

if TYPE_CHECKING:
    from tessera.text.tokenizer import Tokenizer


class StreamDecoder:
    """Incremental detokenization: feed ids one at a time, get back only complete UTF-8 text.

    A character split over several byte tokens is held back until its last byte arrives, so
    the concatenation of everything ``feed`` and ``flush`` return equals ``decode(ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer._strips_prefix_space

    def feed(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        piece = self._tok.token_to_bytes(token_id)  # also rejects ids outside the vocabulary
        special = self._tok.is_special(token_id)
        if special and self._skip_special:
            piece = b""
        if self._strip_space and not special:
            self._strip_space = False
            if self._tok.token_type(token_id) == TokenType.NORMAL and piece.startswith(b" "):
                piece = piece[1:]
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Return what is left (an incomplete character becomes U+FFFD) and reset."""
        return self._utf8.decode(b"", final=True)

"""RWKV's escaped tokens: every escape the vocabulary writer uses reads back to its bytes."""

from __future__ import annotations

import sys

import pytest
from tokenizer_vectors import VOCAB_DIR, metadata

from tessera.plugins.tokenizers.rwkv import unescape_rwkv
from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer, TokenizerError

sys.path.insert(0, str(VOCAB_DIR))
from make_vocabs import _rwkv_escape  # noqa: E402


def test_every_byte_sequence_round_trips_through_its_escape() -> None:
    for b in range(256):
        assert unescape_rwkv(_rwkv_escape(bytes([b]))) == bytes([b])
    assert unescape_rwkv(_rwkv_escape("naïve\t\\n\r\n".encode())) == "naïve\t\\n\r\n".encode()


def test_a_byte_no_token_starts_with_is_a_clear_error() -> None:
    meta = dict(metadata("synthetic-rwkv.gguf"))
    meta["tokenizer.ggml.tokens"] = ["a", "b"]
    meta["tokenizer.ggml.token_type"] = [1, 1]
    with pytest.raises(TokenizerError, match="byte 0x63 starts no token"):
        Tokenizer.from_gguf_metadata(meta, default_runtime()).encode("abc", add_special=False)

"""PLaMo-2's tokenizer refuses a vocabulary without all 256 byte tokens, as llama.cpp does
(its ids on the synthetic vocabulary are checked with every other vocabulary's)."""

from __future__ import annotations

import pytest
from tokenizer_vectors import metadata

from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer, TokenizerError


def test_a_missing_byte_token_is_a_clear_error() -> None:
    meta = dict(metadata("synthetic-plamo2.gguf"))
    byte_41 = meta["tokenizer.ggml.tokens"].index("<0x41>")
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"])
    meta["tokenizer.ggml.token_type"][byte_41] = 1
    with pytest.raises(TokenizerError, match="no byte token <0x41>"):
        Tokenizer.from_gguf_metadata(meta, default_runtime())

"""The unigram (T5) tokenizer's space handling, against llama.cpp with each combination of
tokenizer.ggml.add_space_prefix and remove_extra_whitespaces (llama-cpp-variants.json)."""

from __future__ import annotations

import pytest
from tokenizer_vectors import metadata, recorded

from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer, TokenizerError

NAME = "mini-nomic-bert-moe.gguf"
VARIANTS = recorded("variants")[NAME]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{v['keys']}"))
def test_space_flags_as_llama_cpp(variant: dict) -> None:
    tok = Tokenizer.from_gguf_metadata(dict(metadata(NAME), **variant["keys"]), default_runtime())
    texts = recorded("variants")["texts"]
    assert [tok.encode(t) for t in texts] == variant["ids"]


def test_a_unigram_vocabulary_needs_an_unknown_token() -> None:
    meta = {k: v for k, v in metadata(NAME).items() if k != "tokenizer.ggml.unknown_token_id"}
    meta["tokenizer.ggml.tokens"] = ["a", "b"]  # no default id 2 inside the vocabulary
    meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"] = [0.0, 0.0], [1, 1]
    with pytest.raises(TokenizerError, match="no unknown token"):
        Tokenizer.from_gguf_metadata(meta, default_runtime())

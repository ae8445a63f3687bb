"""The BPE model: GPT-2's byte table against the ``tokenizers`` library's, and the piece cache
never changing an answer."""

from __future__ import annotations

from tokenizer_vectors import metadata, vectors

from tessera.text import bpe
from tessera.text.tokenizer import Tokenizer


def test_byte_table_is_gpt2s() -> None:
    from tokenizers.pre_tokenizers import ByteLevel

    assert sorted(bpe.BYTE_TO_CHAR.values()) == sorted(ByteLevel.alphabet())
    assert all(bpe.CHAR_TO_BYTE[c] == b for b, c in bpe.BYTE_TO_CHAR.items())
    assert bpe.BYTE_TO_CHAR[ord(" ")] == "\u0120" and bpe.BYTE_TO_CHAR[ord("A")] == "A"


def test_answers_do_not_depend_on_the_piece_cache(monkeypatch) -> None:
    monkeypatch.setattr(bpe, "_CACHE_LIMIT", 3)  # the cache starts over every third piece
    tok = Tokenizer.from_gguf_metadata(metadata("ggml-vocab-llama-bpe.gguf"))
    for _ in range(2):
        for text, ids in vectors("ggml-vocab-llama-bpe.gguf"):
            assert tok.encode(text, add_special=False) == ids
    assert len(tok._model._cache) <= 3

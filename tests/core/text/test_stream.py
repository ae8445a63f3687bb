"""Incremental detokenization (StreamDecoder) on llama.cpp's test vocabularies."""

from __future__ import annotations

import pytest
from tokenizer_vectors import tokenizer

from tessera.text.stream import StreamDecoder


def vocab(name: str):
    return tokenizer(f"ggml-vocab-{name}.gguf")


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2", "qwen2"])
@pytest.mark.parametrize("text", ["🦙 llamas 🚀🚀", "日本語のテキスト", "Ünïcödé ✓ 𝔘"])
def test_stream_decoder_yields_only_whole_characters(name: str, text: str) -> None:
    tok = vocab(name)
    ids = tok.encode(text, add_special=False)
    stream = StreamDecoder(tok)
    chunks = [stream.feed(i) for i in ids]
    chunks.append(stream.flush())
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    # each chunk is exactly the characters completed by that token: a partial one waits
    seen, done, expected = b"", 0, []
    for k, token_id in enumerate(ids):
        piece = tok.token_to_bytes(token_id)
        if k == 0 and name == "llama-spm":
            piece = piece.removeprefix(b" ")  # SentencePiece's prefix space is not text
        seen += piece
        end = len(seen) - _tail_len(seen)
        expected.append(seen[done:end].decode("utf-8"))
        done = end
    assert chunks[:-1] == expected


def _tail_len(data: bytes) -> int:
    """How many bytes at the end belong to an unfinished UTF-8 character."""
    n = 0  # continuation bytes (10xxxxxx) at the end
    while n < min(3, len(data)) and (data[-1 - n] & 0xC0) == 0x80:
        n += 1
    if n == len(data):
        return 0
    lead = data[-1 - n]
    need = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return n + 1 if need > n + 1 else 0


def test_stream_decoder_holds_back_the_bytes_of_an_emoji() -> None:
    tok = vocab("gpt-2")
    ids = tok.encode("🦙", add_special=False)
    assert len(ids) > 1  # gpt-2 has no token for it, so its 4 bytes come in pieces
    stream = StreamDecoder(tok)
    assert [stream.feed(i) for i in ids] == [""] * (len(ids) - 1) + ["🦙"]


def test_stream_decoder_flush_replaces_a_cut_character() -> None:
    tok = vocab("llama-spm")
    ids = tok.encode("🦙", add_special=False)
    stream = StreamDecoder(tok)
    assert "".join(stream.feed(i) for i in ids[:-1]) == ""
    assert stream.flush() == "\ufffd"

"""The tokenizer against llama.cpp: every test string of every vocabulary in tests/data/vocab
(llama.cpp's own files, mini and synthetic ones, see its README), with llama.cpp's ids as the
oracle, and the round trips llama.cpp's test-tokenizer-1 programs check."""

from __future__ import annotations

import logging

import pytest
from tokenizer_vectors import metadata, recorded, tokenizer, vectors, vocab_files

from tessera.errors import TesseraError
from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer, TokenizerError

VOCABS = vocab_files()
# Vocabularies whose text does not come back from its ids: WordPiece and the unigram model
# normalize it, the whitespace model drops whitespace, hybriddna pads and upper-cases DNA.
LOSSY = {"ggml-vocab-bert-bge.gguf", "mini-nomic-bert-moe.gguf"} | {
    "synthetic-whitespace.gguf",
    "synthetic-hybriddna.gguf",
}


def _cases(names: list[str]) -> list:
    return [
        pytest.param(name, text, ids, id=f"{name.removesuffix('.gguf')}-{i:02d}")
        for name in names
        for i, (text, ids) in enumerate(vectors(name))
    ]


def test_every_vocabulary_kind_is_covered() -> None:
    kinds = {metadata(name)["tokenizer.ggml.model"] for name in VOCABS}
    assert kinds >= {"llama", "gpt2", "gemma4", "bert", "t5", "rwkv", "plamo2"}
    assert kinds >= {"whitespace", "hybriddna"}


@pytest.mark.parametrize(("name", "text", "ids"), _cases(VOCABS))
def test_encode_matches_llama_cpp(name: str, text: str, ids: list[int]) -> None:
    assert tokenizer(name).encode(text, add_special=False) == ids


@pytest.mark.parametrize(("name", "text", "ids"), _cases([v for v in VOCABS if v not in LOSSY]))
def test_decode_round_trips(name: str, text: str, ids: list[int]) -> None:
    tok = tokenizer(name)
    expected = text.removeprefix("\ufeff") if tok.model == "plamo2" else text  # BOM dropped
    assert tok.decode(ids) == expected
    assert tok.decode(tok.encode(text), skip_special=True) == expected


@pytest.mark.parametrize("name", list(recorded("load")))
def test_special_tokens_bos_and_eos_as_llama_cpp(name: str) -> None:
    """With BOS/EOS added and special tokens parsed, around the vocabulary's own specials."""
    tok = tokenizer(name)
    for text, add_special, parse_special, ids in recorded("load")[name]["cases"]:
        got = tok.encode(text, add_special=add_special, parse_special=parse_special)
        assert got == ids, (text, add_special, parse_special)


# -- llama.cpp's test-tokenizer-1 round trips ------------------------------------------------


def test_every_spm_token_round_trips() -> None:
    """test-tokenizer-1-spm: a token's text, tokenized with specials parsed, decodes back."""
    tok = tokenizer("ggml-vocab-llama-spm.gguf")
    for i in range(tok.n_vocab):
        text = tok.decode([i])
        assert tok.decode(tok.encode(text, add_special=False, parse_special=True)) == text, i


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf"])
def test_code_points_round_trip(name: str) -> None:
    """test-tokenizer-1-*: every code point (here every 13th, and all of ASCII) comes back."""
    tok = tokenizer(name)
    code_points = [*range(128), *range(128, 0x40000, 13), *range(0xE0000, 0x110000, 13)]
    for cp in code_points:
        if 0xD800 <= cp <= 0xDFFF or cp == 0x2581:  # surrogates; SentencePiece's ▁
            continue
        text = chr(cp)
        assert tok.decode(tok.encode(text, add_special=False, parse_special=True)) == text, cp


def test_every_llama3_token_is_one_token_again() -> None:
    """test-tokenizer-1-bpe with --ignore-merges: a token's text is that one token again."""
    tok = tokenizer("ggml-vocab-llama-bpe.gguf")
    for i in range(tok.n_vocab):
        data = tok.token_to_bytes(i)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a byte of a longer character: llama.cpp's test skips it too
        ids = tok.encode(text, add_special=False, parse_special=True)
        assert len(ids) == 1 and tok.decode(ids) == text, (i, text, ids)


# -- errors -------------------------------------------------------------------------------------


def test_metadata_without_a_vocabulary_is_a_clear_error() -> None:
    with pytest.raises(TesseraError, match="no tokenizer"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"})


@pytest.mark.parametrize("model", ["no_vocab", "none"])
def test_a_file_without_vocabulary_says_so(model: str) -> None:
    meta = {"tokenizer.ggml.model": model, "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(TokenizerError, match=f"'{model}': it has no tokenizer"):
        Tokenizer.from_gguf_metadata(meta)


def test_unknown_tokenizer_model_names_itself_and_the_supported_ones() -> None:
    meta = {"tokenizer.ggml.model": "sentencepiece9", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(TokenizerError, match=r"'sentencepiece9'.*llama, gpt2.*t5, rwkv, plamo2"):
        Tokenizer.from_gguf_metadata(meta, default_runtime())
    with pytest.raises(TokenizerError, match=r"'sentencepiece9'.*\(supported: llama, gpt2.*bert\)"):
        Tokenizer.from_gguf_metadata(meta)  # no runtime: the core's kinds only


def test_unknown_pre_tokenizer_is_refused_as_llama_cpp_refuses_it() -> None:
    meta = dict(metadata("ggml-vocab-gpt-2.gguf"), **{"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(TokenizerError, match="pre-tokenizer 'no-such-pre'"):
        Tokenizer.from_gguf_metadata(meta)


def test_missing_pre_tokenizer_uses_default_with_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        tok = tokenizer("ggml-vocab-gpt-neox.gguf")
        Tokenizer.from_gguf_metadata(metadata("ggml-vocab-gpt-neox.gguf"))
    assert "names no pre-tokenizer" in caplog.text
    assert tok.pre is not None and tok.pre.regexes[0].startswith(r"[\p{P}")


def test_add_bos_metadata_overrides_the_default() -> None:
    meta = dict(metadata("ggml-vocab-llama-spm.gguf"), **{"tokenizer.ggml.add_bos_token": False})
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.encode("Hello") == tok.encode("Hello", add_special=False)


def test_out_of_range_id_is_a_clear_error() -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tokenizer("ggml-vocab-gpt-2.gguf").decode([10**9])

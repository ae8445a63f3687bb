"""Every ``tokenizer.ggml.pre`` llama.cpp knows, against llama.cpp's own splitting: the ids it
gives the test strings under each name (tests/data/vocab/llama-cpp-pre.json, on the mini
vocabularies), and the list of names itself."""

from __future__ import annotations

import functools

import pytest
from tokenizer_vectors import metadata, recorded

from tessera.text.pre import PRE_TOKENIZERS
from tessera.text.tokenizer import Tokenizer

RECORDED = {k: v for k, v in recorded("pre").items() if k != "texts"}
TEXTS: list[str] = recorded("pre")["texts"]


def test_tessera_knows_exactly_the_names_llama_cpp_knows() -> None:
    assert sorted(PRE_TOKENIZERS) == sorted(RECORDED)


@functools.cache
def _tokenizer(name: str) -> Tokenizer:
    case = RECORDED[name]
    meta = dict(metadata(case["vocab"]), **{"tokenizer.ggml.pre": name})
    if case["vocab"].startswith("mini-gemma"):  # the raw-UTF-8 BPE pre-tokenizers
        meta["tokenizer.ggml.model"] = "whitespace" if name == "whitespace" else "gpt2"
    return Tokenizer.from_gguf_metadata(meta)


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_pre_tokenizer_splits_as_llama_cpp(name: str) -> None:
    tok = _tokenizer(name)
    got = [tok.encode(text, add_special=False) for text in TEXTS]
    mismatched = [
        i for i, (a, b) in enumerate(zip(got, RECORDED[name]["ids"], strict=True)) if a != b
    ]
    assert not mismatched, [(TEXTS[i][:40], got[i], RECORDED[name]["ids"][i]) for i in mismatched]

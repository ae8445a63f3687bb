"""What the tokenizer derives from a vocabulary on load, against what llama.cpp derives from
the same files (tests/data/vocab/llama-cpp-load.json): token attributes, special ids,
and end-of-generation tokens."""

from __future__ import annotations

import pytest
from tokenizer_vectors import recorded, tokenizer

from tessera.text.vocab import TokenAttr

LOADS = recorded("load")


@pytest.mark.parametrize("name", list(LOADS))
def test_token_attributes_match_llama_cpp(name: str) -> None:
    tok = tokenizer(name)
    mine = {str(i): int(tok.token_attr(i)) for i in range(tok.n_vocab)}
    assert {k: v for k, v in mine.items() if v != TokenAttr.NORMAL} == LOADS[name]["attrs"]


@pytest.mark.parametrize("name", list(LOADS))
def test_end_of_generation_tokens_match_llama_cpp(name: str) -> None:
    assert sorted(tokenizer(name).eog_ids) == LOADS[name]["eog"]


@pytest.mark.parametrize("name", list(LOADS))
def test_special_ids_match_llama_cpp(name: str) -> None:
    tok, facts = tokenizer(name), LOADS[name]
    assert {role: tok.special[role] for role in facts["special"]} == facts["special"]

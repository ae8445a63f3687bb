"""How each kind of tokenizer renders a token (llama.cpp's token_to_piece), against llama.cpp's
pieces of the same vocabularies (tests/data/vocab/llama-cpp-load.json).

One deliberate difference: llama.cpp reads the whitespace model's raw-text tokens as GPT-2
byte-level characters (``ü`` becomes the byte 0xFC, ``你`` "[UNK_BYTE_0x..]"); tessera renders
the token's text.
"""

from __future__ import annotations

import pytest
from tokenizer_vectors import recorded, tokenizer

from tessera.text.vocab import TokenAttr

LOADS = recorded("load")


@pytest.mark.parametrize("name", list(LOADS))
def test_token_pieces_match_llama_cpp(name: str) -> None:
    """token_to_piece with specials rendered, for a thousand tokens across the vocabulary."""
    tok = tokenizer(name)
    pieces = LOADS[name]["pieces"]
    raw_text = tok.model == "whitespace"
    expected = {
        i: tok.token_text(int(i)).encode().hex()
        if raw_text and tok.token_attr(int(i)) & TokenAttr.NORMAL
        else piece
        for i, piece in pieces.items()
    }
    assert {i: tok.token_to_bytes(int(i)).hex() for i in pieces} == expected
    assert (expected != pieces) == raw_text  # the difference is there, and only there

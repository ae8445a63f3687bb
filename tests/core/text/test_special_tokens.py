"""Which special tokens a text holds, against the plain search over every token (llama.cpp's)."""

from __future__ import annotations

import random

import pytest

from tessera.text.special_tokens import SpecialTokens
from tessera.text.vocab import SPECIAL, TokenAttr

NORMAL, USER, CONTROL = int(TokenAttr.NORMAL), int(TokenAttr.USER_DEFINED), int(TokenAttr.CONTROL)


def every_token_searched(tokens: list[str], bits: list[int], text: str) -> list[int]:
    """The oracle: every special token tried against the text, longest in bytes first."""
    order = sorted(
        (i for i in range(len(tokens)) if bits[i] & SPECIAL),
        key=lambda i: (-len(tokens[i].encode()), i),
    )
    first: dict[str, int] = {}
    for i in order:
        first.setdefault(tokens[i], i)
    return [i for i in order if tokens[i] in text and first[tokens[i]] == i]


def padded_vocab(n_pads: int) -> tuple[list[str], list[int]]:
    """Qwen2's shape: normal tokens, a few control ones, many user-defined pads."""
    tokens = ["a", "b", "<", "|", "é", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "▁▁"]
    bits = [NORMAL] * 5 + [CONTROL] * 3 + [USER]
    tokens += [f"<|pad_{i}|>" for i in range(n_pads)]
    bits += [USER] * n_pads
    return tokens, bits


@pytest.mark.parametrize("n_pads", [3, 2000])
def test_a_padded_vocabulary_finds_what_the_plain_search_finds(n_pads):
    tokens, bits = padded_vocab(n_pads)
    specials = SpecialTokens(tokens, bits)
    for text in [
        "Hello",
        "<|im_start|>user\nhi<|im_end|>",
        "<|pad_1|><|pad_12|> x <|pad_1999|><|pad_2000|>",
        "<<|||pad_2|>|>▁▁▁<|endoftext|",
        "",
    ]:
        assert specials.in_text(text) == every_token_searched(tokens, bits, text), text


def test_longest_in_bytes_comes_first_then_the_lower_id():
    tokens = ["éé", "abc", "xyz", "abcd", "é"]  # "éé" is 4 bytes, 2 characters
    bits = [USER] * 5
    assert SpecialTokens(tokens, bits).in_text("xyz abcd éé é") == [0, 3, 1, 2, 4]


def test_a_duplicated_text_is_found_once_under_its_first_id():
    tokens = ["<s>", "x", "<s>", "<s>"]
    bits = [CONTROL, NORMAL, USER, USER]
    assert SpecialTokens(tokens, bits).in_text("a<s>b") == [0]


def test_normal_tokens_are_never_found():
    assert SpecialTokens(["ab", "<b>"], [NORMAL, NORMAL]).in_text("ab<b>") == []


def test_random_vocabularies_and_texts_match_the_plain_search():
    rng = random.Random(7)
    alphabet = "ab<|>é▁\n"
    for _ in range(60):
        n = rng.randint(1, 300)
        tokens = list(
            dict.fromkeys(
                "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(n)
            )
        )
        tokens += rng.sample(tokens, min(3, len(tokens)))  # a few duplicated texts
        bits = [rng.choice([NORMAL, USER, CONTROL]) for _ in tokens]
        specials = SpecialTokens(tokens, bits)
        for _ in range(5):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
            assert specials.in_text(text) == every_token_searched(tokens, bits, text)

"""The WPM word splitting of the BERT vocabulary model."""

from __future__ import annotations

import random

import pytest

from tessera.text.vocab_models import wpm_words, wpm_words_general


@pytest.mark.parametrize("lowercase", [True, False])
def test_wpm_ascii_fast_path_splits_like_the_general_one(lowercase: bool) -> None:
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(128)]  # every ASCII character, controls included
    texts = ["Hello, World! x=1.5e-3 (a+b)*c; don't \x07stop\x1fnow\t\n"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(0, 60))) for _ in range(300)]
    for text in texts:
        assert text.isascii()
        assert wpm_words(text, lowercase) == wpm_words_general(text, lowercase), repr(text)

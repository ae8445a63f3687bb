"""The precompiled charsmap reader, against the ``tokenizers`` library's Precompiled
normalizer on the same blob (one character at a time, where both replace the longest key)."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizer_vectors import metadata

from tessera.plugins.tokenizers.charsmap import Charsmap
from tessera.text.vocab import TokenizerError

BLOB = bytes(
    np.asarray(
        metadata("mini-nomic-bert-moe.gguf")["tokenizer.ggml.precompiled_charsmap"], dtype=np.uint8
    )
)


def test_each_character_is_replaced_as_sentencepiece_replaces_it() -> None:
    from tokenizers.normalizers import Precompiled

    oracle = Precompiled(BLOB)
    charsmap = Charsmap(BLOB)
    changed = 0
    for cp in [*range(1, 0x3000), *range(0xF900, 0x10000)]:
        if 0xD800 <= cp <= 0xDFFF:
            continue
        data = chr(cp).encode()
        match = charsmap.longest_match(data, 0)
        mine = match[1].decode() if match and match[0] == len(data) else chr(cp)
        assert mine == oracle.normalize_str(chr(cp)), hex(cp)
        changed += mine != chr(cp)
    assert changed > 1000  # NFKC rewrites many (full-width forms, ligatures, controls ...)


def test_a_truncated_blob_is_a_clear_error() -> None:
    with pytest.raises(TokenizerError, match="truncated"):
        Charsmap(BLOB[:1000])

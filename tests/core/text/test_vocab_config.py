"""The flags derived from a vocabulary's metadata, against llama.cpp's for the same files."""

from __future__ import annotations

import pytest
from tokenizer_vectors import metadata, recorded

from tessera.testing.pytest_plugin import default_runtime
from tessera.text.vocab_config import vocab_config

LOADS = recorded("load")


@pytest.mark.parametrize("name", list(LOADS))
def test_bos_eos_sep_flags_match_llama_cpp(name: str) -> None:
    config, facts = vocab_config(metadata(name), default_runtime()), LOADS[name]
    assert (config.add_bos, config.add_eos, config.add_sep) == (
        facts["add_bos"],
        facts["add_eos"],
        facts["add_sep"],
    )


def test_gemma4_always_adds_bos() -> None:
    """llama.cpp overrides add_bos_token=false for Gemma 4 (llama-cpp-variants.json)."""
    variant = recorded("variants")["mini-gemma-4.gguf"][0]
    config = vocab_config(dict(metadata("mini-gemma-4.gguf"), **variant["keys"]))
    bos = metadata("mini-gemma-4.gguf")["tokenizer.ggml.bos_token_id"]
    assert config.add_bos and all(ids[0] == bos for ids in variant["ids"])

"""Mistral and Ministral 3 against transformers on committed random-weight checkpoints.

``mistral`` is a Mistral 7B v0.1-style config with a sliding window of 4 (the prompt has
12 tokens), ``ministral3`` Ministral 3's YaRN RoPE (factor 4 over an original context of 8)
with its attention temperature (Q grows past positions 8 and 16). tessera loads each from
its HF folder, from the GGUF llama.cpp's converter wrote (``tests/data/arch``, see
``tests/models/llama_like.py``) and from the GGUF ``tessera convert`` writes, on numpy and
torch in f32, and must reproduce transformers' logits for every prompt row (relative
error <= 1e-5; measured <= 5e-7) and its greedy continuation through the KV cache.

llama.cpp's converter drops Mistral's window (llama.cpp attends to the whole context), so
its file is the model without one, and transformers with ``sliding_window=None`` is that
file's oracle; ``tessera convert`` keeps the window as ``llama.attention.sliding_window``.
"""

from __future__ import annotations

import pytest
from llama_like import (
    FIXTURES,
    Family,
    family_parity,
)

from tessera.files.gguf import read_gguf
from tessera.testing.arch import relative_error
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["mistral", "ministral3"], TOL)


def test_the_sliding_window_is_kept_by_tessera_and_dropped_by_llama_cpp(tmp_path):
    f = Family(FIXTURES["mistral"], tmp_path)
    ours, theirs = (read_gguf(p).metadata for p in (f.tessera_gguf, f.f.gguf))
    assert theirs["general.architecture"] == ours["general.architecture"] == "llama"
    assert "llama.attention.sliding_window" not in theirs
    assert ours["llama.attention.sliding_window"] == 4
    # the window matters here: transformers with and without it differ on this prompt
    _, windowed, _ = f.expected("hf")
    _, whole, _ = f.expected("llama.cpp")
    assert relative_error(windowed, whole) > 100 * TOL


def test_ministral3_keys_are_llama_cpps_yarn_and_temperature():
    meta = read_gguf(FIXTURES["ministral3"].gguf).metadata
    assert meta["mistral3.rope.scaling.type"] == "yarn"
    assert meta["mistral3.rope.scaling.original_context_length"] == 8
    assert meta["mistral3.attention.temperature_scale"] == pytest.approx(0.1)


test_mistral3_conformance = architecture_conformance("mistral3")
test_mistral3_conformance_torch = architecture_conformance("mistral3", backend="torch", dtype="f32")

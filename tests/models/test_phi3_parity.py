"""Phi-3 and Phi-4-mini against transformers on committed random-weight checkpoints.

Both have Phi-3's fused ``attn_qkv`` and gate/up tensors. ``phi3`` (Phi-3 mini) has a
sliding window of 6, shorter than the prompt: tessera applies it as transformers does
(llama.cpp reads the key and attends to the whole context). ``phi4mini`` has LongRoPE on
three quarters of each head (12 of 16 values), tied embeddings and an original context of
16: a context of up to 16 cells rotates with the short factors, a longer one with the long
factors (llama.cpp's choice, by context size), both with the attention factor
``sqrt(1 + ln 4 / ln 16)`` on cos and sin; transformers chooses by sequence length, so
each case keeps both on the same side. tessera loads each from its HF folder, from
llama.cpp's GGUF and from ``tessera convert``'s, on numpy and torch in f32, and must
reproduce transformers' logits for every prompt row (relative error <= 1e-5; measured
<= 5e-7) and its greedy continuation through the KV cache.
"""

from __future__ import annotations

import pytest
from llama_like import (
    BACKENDS,
    FIXTURES,
    SOURCES,
    Family,
    gguf_disagreements,
    tessera_answers,
)

from tessera.files.gguf import read_gguf
from tessera.testing.arch import relative_error
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5
#: (prompt tokens, generated tokens, context cells): short factors, then long ones
LONGROPE_CASES = {"short": (10, 6, 16), "long": (20, 8, 64)}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    return {n: Family(FIXTURES[n], tmp_path_factory.mktemp(n)) for n in ("phi3", "phi4mini")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_phi3_with_its_sliding_window_matches_transformers(families, source, backend):
    family = families["phi3"]
    prompt, logits, greedy = family.expected(source)
    got, tokens = tessera_answers(family.path(source), backend, prompt)
    assert relative_error(got, logits) <= TOL
    assert tokens == greedy


@pytest.mark.parametrize("case", LONGROPE_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_phi4mini_longrope_matches_transformers(families, source, backend, case):
    n_prompt, n_predict, n_ctx = LONGROPE_CASES[case]
    family = families["phi4mini"]
    prompt, logits, greedy = family.expected(source, n_prompt, n_predict)
    got, tokens = tessera_answers(family.path(source), backend, prompt, n_predict, n_ctx)
    assert relative_error(got, logits) <= TOL
    assert tokens == greedy


def test_the_factors_matter_for_this_prompt(families):
    # a 16-cell context (short factors) and a 64-cell one (long) give other logits
    family = families["phi4mini"]
    prompt, _, _ = family.expected("llama.cpp")
    short, _ = tessera_answers(family.f.gguf, "numpy", prompt, 1, n_ctx=16)
    long, _ = tessera_answers(family.f.gguf, "numpy", prompt, 1, n_ctx=64)
    assert relative_error(short, long) > 100 * TOL


@pytest.mark.parametrize("name", ["phi3", "phi4mini"])
def test_tessera_writes_what_llama_cpp_writes(families, name):
    family = families[name]
    assert gguf_disagreements(family.tessera_gguf, family.f.gguf) == []


def test_llama_cpp_stores_longrope_as_factor_tensors_and_an_attention_factor():
    gguf = read_gguf(FIXTURES["phi4mini"].gguf)
    assert gguf.tensors["rope_factors_short.weight"].shape == (6,)
    assert gguf.tensors["rope_factors_long.weight"].shape == (6,)
    assert gguf.metadata["phi3.rope.dimension_count"] == 12
    assert gguf.metadata["phi3.rope.scaling.attn_factor"] == pytest.approx(1.2247449)


test_phi3_conformance = architecture_conformance("phi3")
test_phi3_conformance_torch = architecture_conformance("phi3", backend="torch", dtype="f32")

"""Granite 3 (dense and MoE) against transformers on committed random-weight checkpoints.

Both carry every Granite multiplier away from its neutral value (embeddings x12, residual
branches x0.22, attention scale 0.1 instead of 1/sqrt(16), logits / 8); ``granitemoe`` has
4 experts, top-2, as wide as its FFN, stored fused per layer in the HF checkpoint.
tessera loads each from its HF folder, from llama.cpp's GGUF and from
``tessera convert``'s, on numpy and torch in f32, and must reproduce transformers' logits
for every prompt row (relative error <= 1e-5; measured <= 2e-7) and its greedy
continuation through the KV cache.
"""

from __future__ import annotations

import pytest
from llama_like import (
    FIXTURES,
    RUNTIME,
    family_parity,
)

from tessera.files.load import load_model
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["granite", "granitemoe"], TOL)


@pytest.mark.parametrize("source", ["hf", "llama.cpp"])
def test_the_multipliers_are_read(family, source):
    c = load_model(family.path(source), RUNTIME, "numpy").config
    scales = (c.embedding_scale, c.residual_scale, c.attention_scale, c.logit_scale)
    assert scales == pytest.approx((12.0, 0.22, 0.1, 8.0))


test_granite_conformance = architecture_conformance("granite")
test_granite_conformance_torch = architecture_conformance("granite", backend="torch", dtype="f32")
test_granitemoe_conformance = architecture_conformance("granitemoe")
test_granitemoe_conformance_torch = architecture_conformance(
    "granitemoe", backend="torch", dtype="f32"
)

"""SmolLM3 against transformers on a committed random-weight checkpoint: four layers, the
fourth without RoPE (NoPE, as llama.cpp's smollm3 fixes it: every fourth layer), tied
embeddings. tessera loads it from its HF folder, from llama.cpp's GGUF and from
``tessera convert``'s, on numpy and torch in f32, and must reproduce transformers' logits
for every prompt row (relative error <= 1e-5; measured <= 4e-7) and its greedy
continuation through the KV cache.
"""

from __future__ import annotations

import json

import attrs
import pytest
from llama_like import (
    FIXTURES,
    RUNTIME,
    family_parity,
)

from tessera.errors import ModelFileError
from tessera.files.load import load_model
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["smollm3"], TOL)


@pytest.mark.parametrize("source", ["hf", "llama.cpp"])
def test_the_fourth_layer_runs_without_rope(family, source):
    model = load_model(family.path(source), RUNTIME, "numpy")
    assert model.config.nope_layers == (3,)


def test_a_nope_pattern_gguf_cannot_state_is_refused(family, tmp_path):
    hf = json.loads((family.f.hf_dir / "config.json").read_text())
    hf["no_rope_layers"] = [1, 0, 1, 1]  # transformers runs it; llama.cpp could not
    arch = RUNTIME.hf_architecture("smollm3")
    config = arch.config_from_hf(hf)
    assert config.nope_layers == (1,)
    with pytest.raises(ModelFileError, match=r"layers \[1\].*every 4th"):
        arch.gguf_metadata(config)
    assert arch.gguf_metadata(attrs.evolve(config, nope_layers=(3,)))["smollm3.block_count"] == 4


test_smollm3_conformance = architecture_conformance("smollm3", n_layer=4)
test_smollm3_conformance_torch = architecture_conformance(
    "smollm3", backend="torch", dtype="f32", n_layer=4
)

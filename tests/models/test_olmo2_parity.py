"""OLMo 2 against transformers on a committed random-weight checkpoint: norms after
attention and the FFN instead of before, Q and K normalized over the whole projection,
NeoX RoPE. tessera loads it from its HF folder, from llama.cpp's GGUF and from
``tessera convert``'s, on numpy and torch in f32, and must reproduce transformers' logits
for every prompt row (relative error <= 1e-5; measured <= 7e-7) and its greedy
continuation through the KV cache.
"""

from __future__ import annotations

import pytest
from llama_like import (
    FIXTURES,
    RUNTIME,
    family_parity,
)

from tessera.errors import ModelFileError
from tessera.files.gguf import read_gguf
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["olmo2"], TOL)


def test_olmo3_sliding_window_files_are_refused(family):
    gguf = read_gguf(family.f.gguf)
    shapes = {name: t.shape for name, t in gguf.tensors.items()}
    metadata = dict(gguf.metadata) | {"olmo2.attention.sliding_window": 4096}
    with pytest.raises(ModelFileError, match="OLMo 3"):
        RUNTIME.architecture("olmo2").config_from_gguf(metadata, shapes)


test_olmo2_conformance = architecture_conformance("olmo2")
test_olmo2_conformance_torch = architecture_conformance("olmo2", backend="torch", dtype="f32")

"""RoPE scaling of the ``llama`` arch as llama.cpp's converter writes it, against
transformers on committed random-weight checkpoints: linear (factor 2, the
``rope.scaling.*`` keys), llama3 (a ``rope_freqs`` tensor of per-pair divisors) and YaRN
(factor 4 over an original context of 8, so the 20 positions of a prompt and its
continuation run through the ramp; cos/sin scaled by ``0.1 ln 4 + 1``). tessera loads each
from its HF folder, from llama.cpp's GGUF and from ``tessera convert``'s, on numpy and
torch in f32, and must reproduce transformers' logits for every prompt row (relative error
<= 1e-5; measured <= 4e-7) and its greedy continuation through the KV cache.
"""

from __future__ import annotations

from llama_like import (
    FIXTURES,
    family_parity,
    transformers_answers,
)

from tessera.testing.arch import relative_error

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["llama-linear", "llama-llama3", "llama-yarn"], TOL)


def test_the_scaling_matters_for_this_prompt(family):
    # transformers on the same weights without the scaling gives other logits
    prompt, logits, _ = family.expected("hf")
    plain, _ = transformers_answers(
        family.f, prompt, 1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
    )
    assert relative_error(plain, logits) > 100 * TOL

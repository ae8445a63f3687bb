"""YaRN's per-pair divisors and magnitude scales against transformers' own YaRN
(``_compute_yarn_parameters``: the inverse frequencies and the attention factor)."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tessera.contract.yarn import yarn_divisors, yarn_mscale

#: (rotated values, base, factor, original context, beta_fast, beta_slow)
CASES = [(8, 10000.0, 4.0, 8, 32.0, 1.0), (64, 10000.0, 40.0, 4096, 32.0, 1.0),
         (128, 500000.0, 8.0, 8192, 16.0, 2.0)]  # fmt: skip


def transformers_yarn(n_rot, base, factor, n_ctx_orig, fast, slow, **rope):
    config = AutoConfig.for_model(
        "llama", hidden_size=n_rot * 4, num_attention_heads=4, head_dim=n_rot,
        max_position_embeddings=n_ctx_orig * int(factor),
        rope_parameters={
            "rope_type": "yarn", "rope_theta": base, "factor": factor, "beta_fast": fast,
            "beta_slow": slow, "original_max_position_embeddings": n_ctx_orig, **rope,
        },
    )  # fmt: skip
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    return inv_freq.double().numpy(), attention_factor


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"R{c[0]}-f{c[2]:g}")
def test_the_divisors_give_transformers_frequencies(case):
    n_rot, base, factor, n_ctx_orig, fast, slow = case
    inv_freq, _ = transformers_yarn(*case)
    divisors = yarn_divisors(n_rot, base, 1.0 / factor, n_ctx_orig, fast, slow)
    theta = base ** (-np.arange(0, n_rot, 2) / n_rot)
    np.testing.assert_allclose(theta / divisors, inv_freq, rtol=1e-6)
    assert divisors.min() == pytest.approx(1.0) and divisors.max() == pytest.approx(factor)


@pytest.mark.parametrize(("mscale", "all_dim"), [(None, None), (0.707, 0.707), (1.0, 0.5)])
def test_the_magnitude_scale_is_transformers_attention_factor(mscale, all_dim):
    rope = {} if mscale is None else {"mscale": mscale, "mscale_all_dim": all_dim}
    _, attention_factor = transformers_yarn(*CASES[0], **rope)
    want = (
        yarn_mscale(4.0) if mscale is None else yarn_mscale(4.0, mscale) / yarn_mscale(4.0, all_dim)
    )
    assert want == pytest.approx(attention_factor, rel=1e-12)
    assert yarn_mscale(1.0, 3.0) == 1.0  # not stretched: no scale


@pytest.mark.parametrize("case", CASES[1:], ids=lambda c: f"R{c[0]}-f{c[2]:g}")
def test_untruncated_divisors_give_transformers_frequencies(case):
    n_rot, base, factor, n_ctx_orig, fast, slow = case
    inv_freq, _ = transformers_yarn(*case, truncate=False)
    divisors = yarn_divisors(n_rot, base, 1.0 / factor, n_ctx_orig, fast, slow, truncate=False)
    theta = base ** (-np.arange(0, n_rot, 2) / n_rot)
    np.testing.assert_allclose(theta / divisors, inv_freq, rtol=1e-6)
    truncated = yarn_divisors(n_rot, base, 1.0 / factor, n_ctx_orig, fast, slow)
    assert not np.allclose(divisors, truncated)  # the rounding is visible in these cases

"""gpt-oss's RoPE: NeoX pairs over the whole head, stretched by YaRN
(:mod:`tessera.contract.yarn`).

ggml always rounds YaRN's correction range outwards to whole dims; transformers does
unless ``truncate`` is false, as gpt-oss's ``config.json`` says, so the range is rounded
as the model's :class:`Yarn` says.
"""

from __future__ import annotations

import numpy as np

from tessera.contract.rope import RopeArgs
from tessera.contract.yarn import yarn_divisors, yarn_mscale
from tessera.models.gpt_oss.config import GptOssConfig


def layer_ropes(c: GptOssConfig) -> list[RopeArgs]:
    """Each layer's rotation: sliding layers take ``rope_freq_base_swa``, all the same YaRN."""
    ropes = []
    for il in range(c.n_layer):
        base = c.rope_freq_base_swa if c.swa_layers[il] else c.rope_freq_base
        if c.yarn is None:
            ropes.append(RopeArgs(c.head_dim, base))
            continue
        y = c.yarn
        blend = yarn_divisors(
            c.head_dim, base, 1.0 / y.factor, y.n_ctx_orig, y.beta_fast, y.beta_slow, y.truncate
        )
        mscale = yarn_mscale(y.factor)
        ropes.append(RopeArgs(c.head_dim, base, 1.0, True, blend.astype(np.float32), mscale))
    return ropes

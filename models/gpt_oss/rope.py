"""gpt-oss's RoPE: NeoX pairs over the whole head, stretched by YaRN.

YaRN turns pair ``i`` by ``theta_i * ((1 - r_i) + r_i / factor)``: ``r_i`` ramps from 0
(extrapolate: short wavelengths keep their speed) to 1 (interpolate by ``factor``) between
the dims that make ``beta_fast`` and ``beta_slow`` turns over the original context, and
cos/sin are scaled by ``0.1 ln(factor) + 1``. ggml always rounds that range outwards to
whole dims; transformers does unless ``truncate`` is false, as gpt-oss's ``config.json``
says. The blend is one divisor per pair, so it runs on ``rope_ext``.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from tessera.models.gpt_oss.config import GptOssConfig, Yarn


def yarn_divisors(n_rot: int, freq_base: float, yarn: Yarn) -> np.ndarray:
    """The divisor of each of the ``n_rot / 2`` pairs' speed (float32)."""

    def corr_dim(n_turns: float) -> float:
        # the dim whose wavelength fits n_turns times into the original context
        return (
            n_rot * math.log(yarn.n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(freq_base))
        )

    low, high = corr_dim(yarn.beta_fast), corr_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0.0), min(high, n_rot - 1.0)
    ramp = np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0.0, 1.0)
    return (1.0 / ((1.0 - ramp) + ramp / yarn.factor)).astype(np.float32)


def yarn_mscale(factor: float) -> float:
    return 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0


@attrs.frozen(eq=False)
class LayerRope:
    """What one layer rotates Q and K with."""

    n_rot: int
    freq_base: float
    divisors: np.ndarray | None = None
    mscale: float = 1.0

    def apply(self, b: Any, x: Any, positions: np.ndarray) -> Any:
        if self.divisors is None:
            return b.rope(x, positions, self.n_rot, self.freq_base, True, 1.0)
        return b.rope_ext(
            x, positions, self.n_rot, self.freq_base, True, 1.0, self.divisors, mscale=self.mscale
        )


def layer_ropes(c: GptOssConfig) -> list[LayerRope]:
    """Each layer's rotation: sliding layers take ``rope_freq_base_swa``, all the same YaRN."""
    ropes = []
    for il in range(c.n_layer):
        base = c.rope_freq_base_swa if c.swa_layers[il] else c.rope_freq_base
        if c.yarn is None:
            ropes.append(LayerRope(c.head_dim, base))
        else:
            divisors = yarn_divisors(c.head_dim, base, c.yarn)
            ropes.append(LayerRope(c.head_dim, base, divisors, yarn_mscale(c.yarn.factor)))
    return ropes

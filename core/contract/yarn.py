"""YaRN's RoPE stretch as GGML computes it (``ggml_rope_yarn_corr_dims`` and its ramp), for
every family that scales RoPE with it.

Pair ``i`` turns by ``theta_i * (s (1 - r_i) + r_i)``: ``s`` is ``rope_freq_scale``
(1 / factor) and ``r_i`` ramps from 1 (extrapolate: short wavelengths keep their speed)
to 0 (interpolate) between the dims that make ``beta_fast`` and ``beta_slow`` turns over
the original context. The blend is one factor per pair, so it runs on ``rope_ext`` as
divisors; the magnitude scales are :func:`yarn_mscale`'s.
"""

from __future__ import annotations

import math

import numpy as np


def yarn_mscale(scale: float, mul: float = 1.0) -> float:
    """YaRN's magnitude scale ``0.1 mul ln(scale) + 1`` (1 when not stretched)."""
    return 1.0 if scale <= 1.0 else 0.1 * mul * math.log(scale) + 1.0


def yarn_divisors(
    n_rot: int,
    freq_base: float,
    freq_scale: float,
    n_ctx_orig: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool = True,
) -> np.ndarray:
    """YaRN's blend as a divisor per pair (``n_rot // 2`` of them, float64). ggml always
    rounds the ramp's ends outwards to whole dims; transformers does unless ``truncate``
    is false."""

    def corr_dim(n_turns: float) -> float:
        return n_rot * math.log(n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(freq_base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(0.0, low), min(n_rot - 1.0, high)
    ramp = 1.0 - np.clip((np.arange(n_rot // 2) - low) / max(0.001, high - low), 0.0, 1.0)
    return 1.0 / (freq_scale * (1.0 - ramp) + ramp)

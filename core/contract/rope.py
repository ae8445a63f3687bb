"""What one attention layer rotates Q and K with, for every family that uses RoPE.

A family works its rotation out once per model (its RoPE scaling as its files state it,
YaRN's blend from :mod:`tessera.contract.yarn`) and each layer applies it: the backend's
``rope`` when nothing but base and position scale is asked, ``rope_ext`` with per-pair
divisors or a magnitude scale on cos and sin otherwise.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np


@attrs.frozen(eq=False)
class RopeArgs:
    """The arguments of :meth:`Backend.rope` / ``rope_ext`` for one layer."""

    n_rot: int
    freq_base: float
    freq_scale: float = 1.0
    neox: bool = True
    #: One divisor per rotated pair (llama3's ``rope_freqs``, LongRoPE's, YaRN's blend).
    freq_factors: np.ndarray | None = None
    #: Multiplies cos and sin (YaRN's magnitude, LongRoPE's attention factor).
    mscale: float = 1.0

    @property
    def plain(self) -> bool:
        """Nothing ``rope`` cannot do: no factors, no magnitude scale."""
        return self.freq_factors is None and self.mscale == 1.0

    def apply(self, b: Any, x: Any, positions: np.ndarray) -> Any:
        """``x`` rotated at ``positions`` on backend ``b``."""
        args = (x, positions, self.n_rot, self.freq_base, self.neox, self.freq_scale)
        if self.plain:
            return b.rope(*args)
        if self.mscale == 1.0:  # rope_ext's older signature suffices
            return b.rope_ext(*args, self.freq_factors)
        return b.rope_ext(*args, self.freq_factors, mscale=self.mscale)

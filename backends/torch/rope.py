"""The torch backend's rotary embeddings: ``rope`` and ``rope_ext`` over cos/sin tables made
once per ubatch, the native kernel for small (decode) inputs, and :func:`rotate`, the
rotation in eager torch ops that the native kernel matches bit for bit."""

from __future__ import annotations

import numpy as np
import torch

#: RoPE inputs smaller than this (decode, a few rows) run the native kernel where its probe
#: passes (bf16/f16 on a VNNI CPU; ``TESSERA_NATIVE_DISABLE=1`` turns it off); larger ones
#: stay on torch's ops, which use every thread. (RMSNorm runs natively at every size: its
#: kernel splits rows over the threads.)
NATIVE_SMALL_OP_VALUES = 1 << 16


class RopeOps:
    """The rotary embeddings of :class:`~tessera.backends.torch.ops.TorchBackend` (a mixin:
    its ``_inv_freq`` and ``_rope_tables`` caches are set up in ``TorchBackend.__init__``)."""

    def _rope_table(
        self,
        positions: np.ndarray,
        n_rot: int,
        freq_base: float,
        freq_scale: float,
        freq_factors: np.ndarray | None = None,
        mscale: float = 1.0,
        dtype: torch.dtype | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``(T, 1, n_rot/2)`` (times ``mscale``) in ``dtype`` (default: the
        activation dtype; the native kernel reads them in the rotated tensor's), cached for
        the last positions.

        Every layer of a forward pass rotates at the same positions, so the table is built
        once per ubatch; angles are computed in float64 (positions reach 1e5 and more).
        """
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        factors = None if freq_factors is None else np.asarray(freq_factors, np.float64)
        factors_key = None if factors is None else factors.tobytes()
        dtype = dtype or self.act_dtype
        key = (pos.tobytes(), n_rot, freq_base, freq_scale, factors_key, mscale, dtype)
        table = self._rope_tables.get(key)
        if table is None:
            freq_key = (n_rot, freq_base, freq_scale, factors_key)
            if freq_key not in self._inv_freq:
                exponent = torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot
                inv_freq = freq_scale * freq_base**-exponent
                if factors is not None:
                    inv_freq = inv_freq / torch.from_numpy(factors)
                self._inv_freq[freq_key] = inv_freq
            angle = torch.from_numpy(pos).double()[:, None] * self._inv_freq[freq_key]
            table = tuple(
                t.to(device=self.torch_device, dtype=dtype)[:, None, :]
                for t in (angle.cos() * mscale, angle.sin() * mscale)
            )
            if len(self._rope_tables) >= 8:  # a few rope configs per model, one ubatch each
                self._rope_tables.pop(next(iter(self._rope_tables)))
            self._rope_tables[key] = table
        return table

    def rope(self, x, positions, n_rot, freq_base, neox, freq_scale=1.0):
        return self.rope_ext(x, positions, n_rot, freq_base, neox, freq_scale, None)

    def rope_ext(self, x, positions, n_rot, freq_base, neox, freq_scale, freq_factors, mscale=1.0):
        args = (positions, n_rot, freq_base, freq_scale, freq_factors, mscale, x.dtype)
        cos, sin = self._rope_table(*args)
        native = self._native() if x.numel() < NATIVE_SMALL_OP_VALUES and x.dim() == 3 else None
        if native is not None:
            return native.rope(x, cos, sin, n_rot, neox)  # decode: one C call
        return rotate(x, cos, sin, n_rot, neox)


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, neox: bool
) -> torch.Tensor:
    """RoPE's rotation of the first ``n_rot`` values of each head of ``x`` by the angle
    tables ``cos``/``sin`` (broadcast against ``(..., n_rot / 2)``): pairs ``(j, j +
    n_rot/2)`` when ``neox``, else ``(2j, 2j + 1)``; eager ops, each rounded to x's dtype."""
    half = n_rot // 2
    rot, rest = x[..., :n_rot], x[..., n_rot:]
    if neox:
        a, b = rot[..., :half], rot[..., half:]
        rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:
        pairs = rot.unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated

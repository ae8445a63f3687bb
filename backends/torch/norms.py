"""The torch backend's normalizations: ``rms_norm`` (the native kernel, torch's fused
``F.rms_norm`` where its probe passes, else composed ops; float32 statistics on every path)
and ``layer_norm``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tessera.backends.torch.backend import FUSED_NORM
from tessera.switches import Choice, choose

if TYPE_CHECKING:
    from tessera.backends.torch.ops import TorchBackend


class NormOps:
    """The normalizations of :class:`~tessera.backends.torch.ops.TorchBackend` (a mixin: its
    ``_fused_norm`` and ``_f32_weights`` are set up in ``TorchBackend.__init__``)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        # Statistics in float32: a bf16 sum of squares over thousands of values loses bits.
        native = self._native()
        if native is not None:
            # one C call instead of torch's composite (decode: two norms per layer per
            # token; prefill: 512 x 896 rows in 0.2 ms instead of 1 ms at two threads)
            return native.rms_norm(x, self._f32_weight(weight), eps)
        if self._fused_norm is None:
            choice = self.record_path("RMSNorm", choose_fused_norm(self))
            self._fused_norm = choice.path == "F.rms_norm"
        if self._fused_norm:  # one kernel instead of seven: decode runs two per layer
            w = None if weight is None else weight.float()
            return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
        return self._rms_norm_ops(x, weight, eps)

    def _f32_weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        """A float32 copy of a norm weight, made once (the weight is kept with it, so its
        id is not reused while cached)."""
        if weight is None:
            return None
        hit = self._f32_weights.get(id(weight))
        if hit is None:
            hit = self._f32_weights[id(weight)] = (weight, weight.float().contiguous())
        return hit[1]

    def _rms_norm_ops(
        self, x: torch.Tensor, weight: torch.Tensor | None, eps: float
    ) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.float()
        return y.to(x.dtype)

    def layer_norm(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
    ) -> torch.Tensor:
        dt = x.dtype  # (no generator here: 13 calls per BERT forward)
        if (weight is None or weight.dtype == dt) and (bias is None or bias.dtype == dt):
            # torch normalizes bf16/f16 in float32 internally and rounds once at the end
            return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        xf = x.float()
        w = None if weight is None else weight.float()
        b = None if bias is None else bias.float()
        return F.layer_norm(xf, (x.shape[-1],), w, b, eps).to(x.dtype)


def choose_fused_norm(backend: TorchBackend) -> Choice:
    """``("F.rms_norm", why)`` where ``rms_norm`` runs torch's fused kernel: not switched
    off (``TESSERA_TORCH_FUSED_NORM=0``), present in this torch, and equal to the composed
    ops on a small input on this device (float32 statistics either way)."""

    def probe() -> tuple[bool, str]:
        if not hasattr(F, "rms_norm"):
            return False, "this torch has no F.rms_norm"
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(3, 96, generator=gen).to(backend.torch_device, backend.torch_dtype)
        w = torch.rand(96, generator=gen).to(backend.torch_device, backend.torch_dtype) + 0.5
        try:
            got = F.rms_norm(x.float(), (96,), w.float(), 1e-6).to(x.dtype)
        except RuntimeError as exc:
            return False, f"F.rms_norm failed on {backend.device} ({exc})"
        want = backend._rms_norm_ops(x, w, 1e-6).float()
        if not torch.allclose(got.float(), want, 1e-2):
            return False, "F.rms_norm disagrees with the composed ops on the probe input"
        return True, "one fused kernel instead of seven elementwise ops"

    return choose(FUSED_NORM, probe, on="F.rms_norm", off="composed ops")

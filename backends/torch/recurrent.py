"""The torch backend's ops of recurrent layers: ``sigmoid``, ``ssm_conv`` (a depthwise
causal convolution continuing from its state) and ``gated_delta_net`` (the gated delta
rule token by token; exact, the form llama.cpp also runs for decode)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class RecurrentLayerOps:
    """Mixed into :class:`tessera.backends.torch.ops.TorchBackend`."""

    def sigmoid(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x)

    def ssm_conv(
        self, x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_tokens, channels = x.shape
        xs = torch.cat([state.to(x.dtype), x], dim=0)  # (K - 1 + T, C)
        y = F.conv1d(xs.T[None], weight[:, None, :].to(x.dtype), groups=channels)[0].T
        return y.contiguous(), xs[n_tokens:].clone()

    def gated_delta_net(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # the recurrence runs in float32 whatever the compute dtype, as transformers does
        dtype, group = v.dtype, v.shape[1] // q.shape[1]
        q, k = (t.float().repeat_interleave(group, dim=1) for t in (q, k))
        v, g, beta = v.float(), g.float().exp(), beta.float()
        s = state.float().clone()
        out = torch.empty_like(v)
        for t in range(v.shape[0]):  # sequential in t by definition
            s *= g[t][:, None, None]
            remembered = torch.einsum("hk,hkv->hv", k[t], s)
            delta = (v[t] - remembered) * beta[t][:, None]
            s += k[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hk,hkv->hv", q[t], s)
        return out.to(dtype), s.to(state.dtype)

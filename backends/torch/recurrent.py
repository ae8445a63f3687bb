"""The torch backend's ops of recurrent layers: ``sigmoid``, ``ssm_conv`` (a depthwise
causal convolution continuing from its state) and ``gated_delta_net`` (the gated delta
rule, in float32 whatever the compute dtype).

The delta rule runs token by token for a decode row, and over a prompt in chunks of
:data:`CHUNK` tokens where ``TESSERA_TORCH_CHUNKED_DELTA`` allows (the default): inside a
chunk the sequential updates are folded into a triangular solve and a few matmuls (the
"UT transform" of the DeltaNet papers, the form transformers' reference and llama.cpp's
prefill use), and only the chunks are walked in order. Both give the same result up to
float rounding; the conformance kit checks each against numpy.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.torch.backend import CHUNKED_DELTA
from tessera.switches import Choice, choose

#: Tokens per chunk of the chunked delta rule (transformers' and FLA's default).
CHUNK = 64


class RecurrentLayerOps:
    """Mixed into :class:`tessera.backends.torch.ops.TorchBackend` (which sets
    ``_chunked_delta`` to None: the path is chosen on first use)."""

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
        g: np.ndarray,
        beta: np.ndarray,
        state: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._chunked_delta is None:
            self._chunked_delta = self.record_path("gated delta rule", choose_chunked(self))
        dtype, group = v.dtype, v.shape[1] // q.shape[1]
        q, k = (t.float().repeat_interleave(group, dim=1) for t in (q, k))
        g, beta = (torch.from_numpy(x).to(v.device, torch.float32) for x in (g, beta))
        args = (q, k, v.float(), g, beta, state.float())
        chunked = self._chunked_delta.path == "chunked" and v.shape[0] > 1
        out, s = chunked_delta_rule(*args) if chunked else recurrent_delta_rule(*args)
        return out.to(dtype), s.to(state.dtype)


def choose_chunked(backend: object) -> Choice:
    """``("chunked" | "token by token", why)`` for the rows of a prompt."""

    def probe() -> tuple[bool, str]:
        return True, f"prompts in chunks of {CHUNK} tokens; decode rows token by token"

    return choose(CHUNKED_DELTA, probe, on="chunked", off="token by token")


def recurrent_delta_rule(q, k, v, g, beta, s):
    """Token by token; ``q``, ``k`` ``(T, H, Dk)`` already one per value head."""
    s, decay = s.clone(), g.exp()
    out = torch.empty_like(v)
    for t in range(v.shape[0]):  # sequential in t by definition
        s *= decay[t][:, None, None]
        remembered = torch.einsum("hk,hkv->hv", k[t], s)
        delta = (v[t] - remembered) * beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t], s)
    return out, s


def chunked_delta_rule(q, k, v, g, beta, s):
    """The same over chunks of :data:`CHUNK` tokens (the prompt padded with rows that
    neither decay nor write)."""
    n_tokens, n_head = v.shape[:2]
    pad = (-n_tokens) % CHUNK
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))  # (H, T', D)
    g, beta = (F.pad(x.T, (0, pad)) for x in (g, beta))  # (H, T')
    n_chunks = (n_tokens + pad) // CHUNK
    q, k, v = (x.reshape(n_head, n_chunks, CHUNK, -1) for x in (q, k, v))
    g = g.reshape(n_head, n_chunks, CHUNK).cumsum(-1)  # log decay since the chunk began
    beta = beta.reshape(n_head, n_chunks, CHUNK, 1)
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=v.device).triu(1)
    pair_decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    k_beta = k * beta
    # the chunk's updates as one unit lower-triangular system (I + A) X = B
    system = (k_beta @ k.transpose(-1, -2)) * pair_decay
    u = torch.linalg.solve_triangular(system, v * beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, k_beta * g.exp()[..., None], upper=False, unitriangular=True
    )
    inner = (q @ k.transpose(-1, -2)) * pair_decay
    q_decayed = q * g.exp()[..., None]
    k_decayed = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]  # (H, N, 1, 1)
    out = torch.empty_like(v)
    for i in range(n_chunks):  # the chunks in order: each reads the state the last left
        v_new = u[:, i] - w[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + inner[:, i] @ v_new
        s = s * chunk_decay[:, i] + k_decayed[:, i].transpose(-1, -2) @ v_new
    out = out.reshape(n_head, -1, v.shape[-1])[:, :n_tokens].transpose(0, 1)
    return out.contiguous(), s

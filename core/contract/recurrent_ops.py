"""The optional ops of recurrent layers (linear attention, state-space blocks), with their
numpy references.

A recurrent layer keeps a fixed-size state per sequence instead of KV rows: a short
causal convolution's last inputs and a matrix-valued memory. These ops take that state and
return the new one beside their output, so the caller (the architecture, through
:class:`tessera.engine.recurrent.RecurrentState`) decides where it is kept. Each reads one
sequence's rows, in position order. Backends that have an op answer True to
``supports(op)`` for its name; the defaults decline (raise), as in
:mod:`tessera.contract.optional_ops`.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class RecurrentOps:
    """The recurrent layers' optional ops, mixed into :class:`tessera.contract.backend.Backend`."""

    name: str

    def sigmoid(self, x: Any) -> Any:
        """Optional: elementwise ``1 / (1 + exp(-x))`` (output gates, shared-expert gates)."""
        # An optional op: the default probe declines it, so the core never calls this unless
        # a subclass both implements it and says so in supports().
        raise NotImplementedError(f"backend {self.name} does not implement sigmoid")

    def ssm_conv(self, x: Any, state: Any, weight: Any) -> tuple[Any, Any]:
        """Optional: a depthwise causal convolution over one sequence's rows, continuing from
        its state (GGML's ``ssm_conv``): ``x`` ``(T, C)``, ``state`` ``(K - 1, C)`` the
        inputs before the first row, ``weight`` ``(C, K)``. Returns ``(y, new_state)``:
        ``y[t, c] = sum_j weight[c, j] * xs[t + j, c]`` over ``xs = [state; x]``, shape
        ``(T, C)``, and the last ``K - 1`` rows of ``xs``. No activation is applied."""
        # An optional op: the default probe declines it (see sigmoid).
        raise NotImplementedError(f"backend {self.name} does not implement ssm_conv")

    def gated_delta_net(
        self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any
    ) -> tuple[Any, Any]:
        """Optional: the gated delta rule over one sequence's rows, token by token, from
        ``state`` (GGML's ``gated_delta_net``; Qwen3-Next's linear attention).

        ``q``, ``k`` ``(T, Hk, Dk)`` (normalized and scaled by the caller), ``v`` ``(T, H,
        Dv)`` with ``H`` a multiple of ``Hk`` (value head ``h`` reads key head ``h // (H /
        Hk)``), ``g`` ``(T, H)`` the log decay (<= 0) and ``beta`` ``(T, H)`` the write
        strength as float32 numpy arrays (gates made on the host, kept in float32 whatever
        the compute dtype, as transformers keeps them), ``state`` ``(H, Dk, Dv)``. Per
        token: ``S = exp(g) S``; ``S += k (beta (v - k^T S))^T``; ``o = q^T S``. Returns
        ``(o (T, H, Dv), S)``."""
        # An optional op: the default probe declines it (see sigmoid).
        raise NotImplementedError(f"backend {self.name} does not implement gated_delta_net")


def sigmoid_reference(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def ssm_conv_reference(
    x: np.ndarray, state: np.ndarray, weight: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    n_tokens, width = len(x), weight.shape[1]
    xs = np.concatenate([state, x], axis=0)
    y = sum(xs[j : j + n_tokens] * weight[:, j] for j in range(width))
    return np.asarray(y, dtype=np.float32), xs[n_tokens:].copy()


def gated_delta_net_reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    group = v.shape[1] // q.shape[1]
    q, k = np.repeat(q, group, axis=1), np.repeat(k, group, axis=1)  # (T, H, Dk)
    s = s.astype(np.float32).copy()
    out = np.empty(v.shape, dtype=np.float32)
    for t in range(len(v)):  # the recurrence is sequential in t by definition
        s *= np.exp(g[t])[:, None, None]
        remembered = np.einsum("hk,hkv->hv", k[t], s)
        delta = (v[t] - remembered) * beta[t][:, None]
        s += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], s)
    return out, s

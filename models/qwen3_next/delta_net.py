"""Qwen3-Next's linear-attention layer: the gated delta net.

Per token: one projection gives Q, K, V (``attn_qkv``), another the output gate Z
(``attn_gate``), a third per value head the write strength ``beta = sigmoid(b)`` and the
log decay ``g = ssm_a * softplus(a + dt_bias)`` (``ssm_ba``; ``ssm_a = -exp(A_log)``).
Q, K and V go through a short causal conv (``ssm_conv1d``, then SiLU) that continues from
the sequence's conv state, Q and K are L2-normalized (Q also scaled by ``1 / sqrt(Dk)``),
and the gated delta rule folds them into the sequence's memory (``gated_delta_net``). The
output is RMS-normed per head, gated by ``silu(Z)`` and projected (``ssm_out``).

The states are the context's (:class:`tessera.engine.recurrent.RecurrentView`), one per
sequence; without a view (embedding mode) each sequence of the ubatch starts from zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.models.qwen3_next.config import Qwen3NextConfig
from tessera.switches import ON, Switch, choose

STACKED_DECODE = Switch(
    "TESSERA_QWEN3NEXT_STACKED_DECODE",
    "a decode step of several sequences through the delta net in one call per op, their "
    "heads and conv channels side by side; 0: one call per sequence",
    ON,
    default=True,
)

#: transformers' (and FLA's) epsilon of the L2 norm of Q and K.
L2_EPS = 1e-6


class FreshStates:
    """Zero states per sequence, not kept: what a ubatch sees without the context's."""

    def __init__(self, backend: Any, c: Qwen3NextConfig, inp: ForwardInput) -> None:
        seq_ids = inp.seq_ids if inp.seq_ids is not None else np.zeros(len(inp.tokens), int)
        self.groups = tuple((int(s), np.flatnonzero(seq_ids == s)) for s in np.unique(seq_ids))
        self.n_rows = len(inp.tokens)
        self._conv = backend.zeros((c.conv_kernel - 1, c.conv_dim))
        self._ssm = backend.zeros((c.n_v_heads, c.k_head_dim, c.v_head_dim))

    def conv(self, il: int, seq: int) -> Any:
        return self._conv

    def ssm(self, il: int, seq: int) -> Any:
        return self._ssm

    def write(self, il: int, seq: int, conv: Any, ssm: Any) -> None:
        """Nothing is kept."""


class GatedDeltaNet:
    """The linear-attention layers of one model on one backend."""

    def __init__(self, c: Qwen3NextConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c, self.w, self.b = c, weights, backend
        # per layer, host copies of the per-head decay parameters (the gates run on the host)
        self._decay = {
            il: (
                backend.to_numpy(weights[f"blk.{il}.ssm_a"]).astype(np.float64),
                backend.to_numpy(weights[f"blk.{il}.ssm_dt.bias"]).astype(np.float64),
            )
            for il in range(c.n_layer)
            if c.recurrent[il]
        }
        stacked = choose(
            STACKED_DECODE,
            lambda: (True, "one decode row per sequence: heads side by side"),
            on="stacked",
            off="per sequence",
        )
        backend.record("delta net decode", *stacked)
        self.stacked_decode = stacked.path == "stacked"
        self._tiled: dict[tuple[int, int], Any] = {}  # conv weights repeated per sequence

    def _gates(self, il: int, h: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(g, beta)``, each float32 ``(T, H)``: per key head the projection holds its
        value heads' ``b`` then their ``a``."""
        c, r = self.c, self.c.n_v_heads // self.c.n_k_heads
        ba = self.b.to_numpy(self.b.matmul(h, self.w[f"blk.{il}.ssm_ba.weight"]))
        ba = ba.reshape(len(ba), c.n_k_heads, 2 * r).astype(np.float64)
        b, a = ba[:, :, :r].reshape(len(ba), -1), ba[:, :, r:].reshape(len(ba), -1)
        ssm_a, dt_bias = self._decay[il]
        g = ssm_a * np.logaddexp(0.0, a + dt_bias)  # softplus
        beta = 1.0 / (1.0 + np.exp(-b))
        return g.astype(np.float32), beta.astype(np.float32)

    def __call__(self, il: int, h: Any, inp: ForwardInput) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n_tokens = len(inp.tokens)
        qkv = b.matmul(h, w[p + "attn_qkv.weight"])
        z = b.matmul(h, w[p + "attn_gate.weight"]).reshape(n_tokens, c.n_v_heads, c.v_head_dim)
        g, beta = self._gates(il, h)
        states = inp.recurrent if inp.recurrent is not None else FreshStates(b, c, inp)
        if self._stackable(states, n_tokens):
            out = self._stacked_decode(il, qkv, g, beta, states)
            return self._output(il, out, z, n_tokens)
        whole = len(states.groups) == 1  # one sequence: its rows are the ubatch, in order
        out = None if whole else b.zeros((n_tokens, c.n_v_heads, c.v_head_dim))
        for seq, rows in states.groups:
            x = qkv if whole else b.get_rows(qkv, rows)
            o, conv, ssm = self._sequence(il, x, g[rows], beta[rows], states, seq)
            states.write(il, seq, conv, ssm)
            if whole:
                out = o
            else:
                b.set_rows(out, rows, o)
        return self._output(il, out, z, n_tokens)

    def _output(self, il: int, out: Any, z: Any, n_tokens: int) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        out = b.mul(b.rms_norm(out, w[p + "ssm_norm.weight"], c.rms_eps), b.silu(z))
        return b.matmul(out.reshape(n_tokens, c.value_dim), w[p + "ssm_out.weight"])

    def _stackable(self, states: Any, n_tokens: int) -> bool:
        """A decode step of several sequences, one row each, in sequence order."""
        groups = states.groups
        return (
            self.stacked_decode
            and hasattr(states, "stacked")
            and len(groups) > 1
            and len(groups) == n_tokens
            and all(len(rows) == 1 and rows[0] == i for i, (_, rows) in enumerate(groups))
        )

    def _stacked_decode(
        self, il: int, qkv: Any, g: np.ndarray, beta: np.ndarray, states: Any
    ) -> Any:
        """The S sequences' rows as one sequence of S times the heads and channels: the
        conv is depthwise and the delta rule per head, so side by side they do not mix."""
        b, c = self.b, self.c
        n = len(g)
        conv, ssm = states.stacked(il)  # (S, K - 1, C), (S, H, Dk, Dv)
        conv = conv.swapaxes(0, 1).reshape(c.conv_kernel - 1, n * c.conv_dim)
        if (il, n) not in self._tiled:
            w = b.to_numpy(self.w[f"blk.{il}.ssm_conv1d.weight"])
            self._tiled[il, n] = b.from_numpy(np.tile(w, (n, 1)))
        y, conv = b.ssm_conv(qkv.reshape(1, n * c.conv_dim), conv, self._tiled[il, n])
        q, k, v = self._qkv(b.silu(y).reshape(n, c.conv_dim), n)
        o, ssm = b.gated_delta_net(
            q.reshape(1, n * c.n_k_heads, -1),
            k.reshape(1, n * c.n_k_heads, -1),
            v.reshape(1, n * c.n_v_heads, -1),
            g.reshape(1, -1),
            beta.reshape(1, -1),
            ssm.reshape(n * c.n_v_heads, c.k_head_dim, c.v_head_dim),
        )
        conv = conv.reshape(c.conv_kernel - 1, n, c.conv_dim).swapaxes(0, 1)
        states.write_stacked(il, conv, ssm.reshape(n, c.n_v_heads, c.k_head_dim, c.v_head_dim))
        return o.reshape(n, c.n_v_heads, c.v_head_dim)

    def _qkv(self, y: Any, n: int) -> tuple[Any, Any, Any]:
        """Q, K (L2-normed, Q scaled) and V of the conv's output ``(n, C)``."""
        b, c = self.b, self.c
        kd, dk = c.key_dim, c.k_head_dim
        q = y[:, :kd].reshape(n, c.n_k_heads, dk)
        k = y[:, kd : 2 * kd].reshape(n, c.n_k_heads, dk)
        v = y[:, 2 * kd :].reshape(n, c.n_v_heads, c.v_head_dim)
        # L2 norm as an RMS norm: x / sqrt(sum x^2 + eps) = rms_norm(x, eps / D) / sqrt(D)
        q = b.scale(b.rms_norm(q, None, L2_EPS / dk), 1.0 / dk)  # and Q's 1 / sqrt(Dk)
        k = b.scale(b.rms_norm(k, None, L2_EPS / dk), 1.0 / math.sqrt(dk))
        return q, k, v

    def _sequence(
        self, il: int, x: Any, g: np.ndarray, beta: np.ndarray, states: Any, seq: int
    ) -> tuple[Any, Any, Any]:
        """One sequence's rows through the conv and the delta rule, from its states."""
        b = self.b
        y, conv = b.ssm_conv(x, states.conv(il, seq), self.w[f"blk.{il}.ssm_conv1d.weight"])
        q, k, v = self._qkv(b.silu(y), len(g))
        o, ssm = b.gated_delta_net(q, k, v, g, beta, states.ssm(il, seq))
        return o, conv, ssm

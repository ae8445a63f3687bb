"""The forward pass of a Qwen3-Next model: pre-norm blocks whose token mixer is a gated
delta net (:mod:`tessera.models.qwen3_next.delta_net`) or gated full attention, and whose
FFN is routed experts plus a gated shared expert.

Full attention: the Q projection gives each head its query and an output gate side by
side; Q and K are RMS-normed per head, RoPE (NeoX) turns the first ``n_rot`` values, and
the attention output is scaled by ``sigmoid(gate)`` before ``attn_output``. The MoE: softmax
router, top ``n_expert_used`` renormalized, SwiGLU experts, plus a shared SwiGLU expert
scaled by ``sigmoid(ffn_gate_inp_shexp)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tessera.contract.arch import ForwardInput
from tessera.contract.experts import ModelExperts, moe_ffn_enabled, moe_ffn_fallback
from tessera.contract.routing import route_experts
from tessera.models.qwen3_next.config import Qwen3NextConfig
from tessera.models.qwen3_next.delta_net import GatedDeltaNet
from tessera.models.qwen3_next.rope import rotation


class Qwen3NextGraph:
    """The forward pass of a Qwen3-Next model on one backend."""

    def __init__(
        self,
        config: Qwen3NextConfig,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts,
    ) -> None:
        self.c, self.w, self.b, self.experts = config, weights, backend, experts
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.delta_net = GatedDeltaNet(config, weights, backend)
        self.rotation = rotation(config.n_rot, config.rope_freq_base, config.rope_scaling)
        self.use_op, why = moe_ffn_enabled(
            backend, n_expert=config.n_expert, n_expert_used=config.n_expert_used
        )
        backend.record("moe_ffn", "moe_ffn" if self.use_op else "core-op fallback", why)

    def _attention(self, il: int, h: Any, inp: ForwardInput) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n, d = len(inp.tokens), c.head_dim
        q_gate = b.matmul(h, w[p + "attn_q.weight"]).reshape(n, c.n_head, 2 * d)
        q, gate = q_gate[:, :, :d], q_gate[:, :, d:]
        k = b.matmul(h, w[p + "attn_k.weight"]).reshape(n, c.n_head_kv, d)
        v = b.matmul(h, w[p + "attn_v.weight"]).reshape(n, c.n_head_kv, d)
        q = b.rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)
        k = b.rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
        q = self.rotation.apply(b, q, inp.positions)
        k = self.rotation.apply(b, k, inp.positions)
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v)
        out = kv.attend(b, il, q, 1.0 / math.sqrt(d))
        out = b.mul(out, b.sigmoid(gate.reshape(n, c.n_head * d)))
        return b.matmul(out, w[p + "attn_output.weight"])

    def _ffn(self, il: int, h: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        logits = b.to_numpy(b.matmul(h, w[p + "ffn_gate_inp.weight"]))
        ids, weights = route_experts(logits, c.n_expert_used, c.routing, None)
        experts = self.experts.layer(il)
        if self.use_op:
            out = b.moe_ffn(h, ids, weights, experts)
        else:
            out = moe_ffn_fallback(b, h, ids, weights, experts)
        shared = b.gate_up_swiglu(h, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"])
        shared = b.matmul(shared, w[p + "ffn_down_shexp.weight"])
        scale = b.sigmoid(b.matmul(h, w[p + "ffn_gate_inp_shexp.weight"]))  # (T, 1)
        return b.add(out, b.mul(shared, scale))

    def _layer(self, il: int, x: Any, inp: ForwardInput, prune: bool) -> Any:
        """One block; with ``prune`` only the output rows leave it."""
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        h = b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)
        mixed = self.delta_net(il, h, inp) if c.recurrent[il] else self._attention(il, h, inp)
        if prune:  # only the rows that need logits go through the last FFN and the head
            mixed, x = b.get_rows(mixed, inp.output_rows), b.get_rows(x, inp.output_rows)
        x = b.add(x, mixed)
        return b.add(
            x, self._ffn(il, b.rms_norm(x, w[p + "post_attention_norm.weight"], c.rms_eps))
        )

    def forward(self, inp: ForwardInput) -> Any:
        b, c = self.b, self.c
        x = b.get_rows(self.w["token_embd.weight"], inp.tokens)
        prune = len(inp.output_rows) != len(inp.tokens)
        for il in range(c.n_layer):
            x = self._layer(il, x, inp, prune=prune and il == c.n_layer - 1)
        x = b.rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        return b.matmul(x, self.output)

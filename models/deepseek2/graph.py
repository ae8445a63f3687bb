"""The forward pass of a DeepSeek-V2/V3 model: pre-norm blocks of MLA attention
(:mod:`tessera.models.deepseek2.mla`) and an FFN that is dense in the first
``n_dense_lead`` blocks and DeepSeek MoE after them: the routed experts the router chose
(:func:`tessera.contract.routing.route_experts`: softmax or a biased sigmoid, expert
groups, renormalization, ``routed_scaling_factor``) plus the shared experts, ungated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.contract.arch import ForwardInput
from tessera.contract.experts import ModelExperts, moe_ffn_enabled, moe_ffn_fallback
from tessera.contract.routing import route_experts
from tessera.models.deepseek2.config import DeepSeek2Config
from tessera.models.deepseek2.mla import MLAttention


class DeepSeek2Graph:
    """The forward pass of a DeepSeek-V2/V3 model on one backend."""

    def __init__(
        self,
        config: DeepSeek2Config,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts,
    ) -> None:
        self.c = c = config
        self.w, self.b, self.experts = weights, backend, experts
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.attention = MLAttention(c, weights, backend)
        self.use_op, why = moe_ffn_enabled(
            backend, n_expert=c.n_expert, n_expert_used=c.n_expert_used
        )
        backend.record("moe_ffn", "moe_ffn" if self.use_op else "core-op fallback", why)
        # the routing runs on the host: each selection bias as host data, made once
        self._bias = {
            il: backend.to_numpy(weights[f"blk.{il}.exp_probs_b.bias"])
            for il in range(c.n_layer)
            if c.expert_bias and c.is_moe_layer(il)
        }

    def _ffn(self, il: int, h: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        if not c.is_moe_layer(il):
            return b.matmul(
                b.gate_up_swiglu(h, w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]),
                w[p + "ffn_down.weight"],
            )
        logits = b.to_numpy(b.matmul(h, w[p + "ffn_gate_inp.weight"]))
        ids, weights = route_experts(logits, c.n_expert_used, c.routing, self._bias.get(il))
        experts = self.experts.layer(il)
        if self.use_op:
            out = b.moe_ffn(h, ids, weights, experts)
        else:
            out = moe_ffn_fallback(b, h, ids, weights, experts)
        if not c.n_expert_shared:
            return out
        shared = b.gate_up_swiglu(h, w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"])
        return b.add(out, b.matmul(shared, w[p + "ffn_down_shexp.weight"]))

    def _layer(self, il: int, x: Any, inp: ForwardInput, prune: bool) -> Any:
        """One block; with ``prune`` only the output rows leave it."""
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        attn = self.attention(il, b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps), inp)
        if prune:  # only the rows that need logits go through the last FFN and the head
            attn, x = b.get_rows(attn, inp.output_rows), b.get_rows(x, inp.output_rows)
        x = b.add(x, attn)
        return b.add(x, self._ffn(il, b.rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)))

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

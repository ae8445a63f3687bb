"""The forward pass of the llama family's MoE models: the llama graph with routed experts
(plus shared experts) in place of the FFN, except in the leading dense blocks.

Per MoE block: the router (``ffn_gate_inp``) scores the experts, the routing rules choose
and weigh the top ``n_expert_used`` (:func:`tessera.contract.routing.route_experts`:
softmax or sigmoid, a selection bias, expert groups, renormalization, a weight scale),
and the chosen experts' SwiGLU FFNs are summed with those weights; a shared expert that
every token runs is added, scaled by ``sigmoid(ffn_gate_inp_shexp)`` where it is gated
(qwen2moe).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tessera.contract.experts import ModelExperts, moe_ffn_enabled, moe_ffn_fallback
from tessera.contract.routing import route_experts
from tessera.models.llama.graph import LlamaGraph
from tessera.models.llama.moe_config import MoEConfig


class MoEGraph(LlamaGraph):
    """A llama-family graph whose FFN is routed experts (plus a shared expert)."""

    def __init__(
        self, config: MoEConfig, weights: Mapping[str, Any], backend: Any, experts: ModelExperts
    ) -> None:
        super().__init__(config, weights, backend)
        self.experts = experts
        self.use_op, why = moe_ffn_enabled(
            backend, n_expert=config.n_expert, n_expert_used=config.n_expert_used
        )
        backend.record("moe_ffn", "moe_ffn" if self.use_op else "core-op fallback", why)
        # the routing runs on the host: each selection bias as host data, made once
        n_blocks = config.n_layer + config.n_nextn
        self._bias = {
            il: backend.to_numpy(weights[f"blk.{il}.exp_probs_b.bias"])
            for il in range(n_blocks)
            if config.expert_bias and config.is_moe_layer(il)
        }

    def _ffn(self, il: int, h: Any) -> Any:
        b, c, p = self.b, self.c, f"blk.{il}."
        if not c.is_moe_layer(il):
            return super()._ffn(il, h)
        logits = b.to_numpy(b.matmul(h, self.w[p + "ffn_gate_inp.weight"]))
        ids, weights = route_experts(logits, c.n_expert_used, c.routing, self._bias.get(il))
        experts = self.experts.layer(il)
        if self.use_op:
            out = b.moe_ffn(h, ids, weights, experts)
        else:
            out = moe_ffn_fallback(b, h, ids, weights, experts)
        if not c.n_ff_shexp:
            return out
        gate = b.matmul(h, self.w[p + "ffn_gate_shexp.weight"])
        up = b.matmul(h, self.w[p + "ffn_up_shexp.weight"])
        shared = b.matmul(b.swiglu(gate, up), self.w[p + "ffn_down_shexp.weight"])
        if not c.shexp_gated:
            return b.add(out, shared)
        score = b.to_numpy(b.matmul(h, self.w[p + "ffn_gate_inp_shexp.weight"])).reshape(-1, 1)
        sigmoid = (1.0 / (1.0 + np.exp(-score))).astype(np.float32)
        return b.add(out, b.mul(shared, b.from_numpy(sigmoid)))

"""The gpt-oss forward pass over backend ops, as llama.cpp's ``openai-moe`` graph builds it.

Per layer: ``x += attn(rmsnorm(x))`` then ``x += moe(rmsnorm(x))``. Attention: Q/K/V and
output projections with biases, GQA, NeoX RoPE with YaRN (:mod:`tessera.models.gpt_oss.rope`),
scores scaled by ``1/sqrt(head_dim)``, a sliding window on every other layer, and a learned
sink logit per head in each softmax (``attn_sinks``). The FFN is routed experts
(:mod:`tessera.models.gpt_oss.experts`). Then the final RMSNorm and the (untied) LM head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.contract.arch import ForwardInput
from tessera.contract.experts import ModelExperts
from tessera.models.gpt_oss.config import GptOssConfig
from tessera.models.gpt_oss.experts import route, routed_experts
from tessera.models.gpt_oss.rope import layer_ropes


class GptOssGraph:
    """The forward pass of one gpt-oss model on one backend."""

    def __init__(
        self, config: GptOssConfig, weights: Mapping[str, Any], backend: Any, experts: ModelExperts
    ) -> None:
        self.c, self.w, self.b, self.experts = config, weights, backend, experts
        self.attn_scale = config.head_dim**-0.5
        self.ropes = layer_ropes(config)

    def _project(self, x: Any, name: str) -> Any:
        return self.b.add(self.b.matmul(x, self.w[name + ".weight"]), self.w[name + ".bias"])

    def _attention(self, il: int, h: Any, inp: ForwardInput) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n = len(inp.tokens)
        names = (p + "attn_q", p + "attn_k", p + "attn_v")
        q, k, v = b.matmul_n(h, [w[m + ".weight"] for m in names], [w[m + ".bias"] for m in names])
        rope = self.ropes[il]
        q = rope.apply(b, q.reshape(n, c.n_head, c.head_dim), inp.positions)
        k = rope.apply(b, k.reshape(n, c.n_head_kv, c.head_dim), inp.positions)
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v.reshape(n, c.n_head_kv, c.head_dim))
        sinks = w[p + "attn_sinks.weight"]
        out = kv.attend(b, il, q, self.attn_scale, c.window(il), sinks=sinks)
        return self._project(out, p + "attn_output")

    def _moe(self, il: int, h: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        ids, weights = route(b.to_numpy(self._project(h, p + "ffn_gate_inp")), c.n_expert_used)
        biases = tuple(w[f"{p}ffn_{part}_exps.bias"] for part in ("gate", "up", "down"))
        experts = self.experts.layer(il)
        return routed_experts(b, h, ids, weights, experts, biases, c.swiglu_alpha, c.swiglu_limit)

    def forward(self, inp: ForwardInput) -> Any:
        b, c, w = self.b, self.c, self.w
        x = b.get_rows(w["token_embd.weight"], inp.tokens)
        all_rows = len(inp.output_rows) == len(inp.tokens)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            attn = self._attention(il, b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps), inp)
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows that need logits go through the last FFN and the head.
                attn, x = b.get_rows(attn, inp.output_rows), b.get_rows(x, inp.output_rows)
            x = b.add(x, attn)
            h = b.rms_norm(x, w[p + "post_attention_norm.weight"], c.rms_eps)
            x = b.add(x, self._moe(il, h))
        x = b.rms_norm(x, w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        return b.matmul(x, w["output.weight"])

"""The Gemma 2 / Gemma 3 forward pass over backend ops (see :mod:`tessera.models.gemma.arch`).

Per layer, as transformers' ``Gemma2DecoderLayer`` / ``Gemma3DecoderLayer``:
``x += norm(attn(norm(x)))``, then ``x += norm(ffn(norm(x)))`` with a GELU(tanh)-gated FFN;
the input is the token embedding times ``sqrt(n_embd)``, the output head the tied embedding.
Norm weights arrive as ``1 + w`` (see :mod:`tessera.models.gemma.config`), so every norm is a
plain RMSNorm here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tessera.contract.arch import ForwardInput
from tessera.models.gemma.config import GemmaConfig


class GemmaGraph:
    """The forward pass of one Gemma 2 or Gemma 3 text model on one backend."""

    def __init__(self, config: GemmaConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c, self.w, self.b = config, weights, backend
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.attn_scale = config.query_pre_attn_scalar**-0.5

    def _attention(self, il: int, h: Any, inp: ForwardInput) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n = len(inp.tokens)
        q, k, v = b.matmul_n(
            h, [w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"]]
        )
        q = q.reshape(n, c.n_head, c.head_dim)
        k = k.reshape(n, c.n_head_kv, c.head_dim)
        v = v.reshape(n, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = b.rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)
            k = b.rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
        base, scale = c.rope(il)
        q = b.rope(q, inp.positions, c.head_dim, base, True, scale)
        k = b.rope(k, inp.positions, c.head_dim, base, True, scale)
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v)
        out = kv.attend(b, il, q, self.attn_scale, c.window(il), c.attn_softcap)
        return b.matmul(out, w[p + "attn_output.weight"])

    def _ffn(self, il: int, h: Any) -> Any:
        b, w, p = self.b, self.w, f"blk.{il}."
        gate, up = b.matmul_n(h, [w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"]])
        return b.matmul(b.mul(b.gelu(gate), up), w[p + "ffn_down.weight"])

    def forward(self, inp: ForwardInput) -> Any:
        b, c, w = self.b, self.c, self.w
        x = b.scale(b.get_rows(w["token_embd.weight"], inp.tokens), math.sqrt(c.n_embd))
        all_rows = len(inp.output_rows) == len(inp.tokens)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            attn = self._attention(il, b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps), inp)
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows that need logits go through the last FFN and the head.
                attn, x = b.get_rows(attn, inp.output_rows), b.get_rows(x, inp.output_rows)
            x = b.add(x, b.rms_norm(attn, w[p + "post_attention_norm.weight"], c.rms_eps))
            h = self._ffn(il, b.rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps))
            x = b.add(x, b.rms_norm(h, w[p + "post_ffw_norm.weight"], c.rms_eps))
        x = b.rms_norm(x, w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        logits = b.matmul(x, self.output)
        cap = c.final_softcap
        return b.scale(b.tanh(b.scale(logits, 1.0 / cap)), cap) if cap else logits

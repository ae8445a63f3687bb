"""The forward pass of the ``gemma-embedding`` architecture (see
:mod:`tessera.models.gemma_embedding.arch`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.engine.pooling import SequenceAttention
from tessera.errors import TesseraError

if TYPE_CHECKING:
    from tessera.models.gemma_embedding.arch import GemmaEmbeddingConfig

#: GGML's fixed local RoPE base of Gemma 3's sliding layers.
ROPE_BASE_LOCAL = 10000.0


class GemmaEmbeddingGraph:
    """The bidirectional Gemma 3 forward pass: hidden states, never logits."""

    def __init__(self, c: GemmaEmbeddingConfig, weights: Mapping[str, Any], backend: Any):
        self.c, self.w, self.b = c, weights, backend
        self.scale = c.query_pre_attn_scalar**-0.5
        self.window = c.n_swa // 2 + 1  # HF's exclusive bound: |pos_q - pos_k| < window

    def _attention(self, il: int, x: Any, inp: ForwardInput, attention: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n = len(inp.tokens)
        q = b.matmul(x, w[p + "attn_q.weight"]).reshape(n, c.n_head, c.head_dim)
        k = b.matmul(x, w[p + "attn_k.weight"]).reshape(n, c.n_head_kv, c.head_dim)
        v = b.matmul(x, w[p + "attn_v.weight"]).reshape(n, c.n_head_kv, c.head_dim)
        q = b.rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps)
        k = b.rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps)
        base = ROPE_BASE_LOCAL if c.is_swa(il) else c.rope_freq_base
        q = b.rope(q, inp.positions, c.head_dim, base, True)
        k = b.rope(k, inp.positions, c.head_dim, base, True)
        window = self.window if c.is_swa(il) else 0
        out = attention.attend(b, q, k, v, self.scale, window)
        return b.matmul(out, w[p + "attn_output.weight"])

    def forward(self, inp: ForwardInput) -> Any:
        if not inp.embeddings:
            raise TesseraError(
                "this is an EmbeddingGemma encoder: it has no LM head and cannot generate; "
                "use it for embeddings (tessera embed)"
            )
        b, c, w = self.b, self.c, self.w
        n = len(inp.tokens)
        attention = inp.kv
        if attention is None:
            seq_ids = np.zeros(n, np.int32) if inp.seq_ids is None else inp.seq_ids
            attention = SequenceAttention(seq_ids, "dense", inp.positions)
        x = b.scale(b.get_rows(w["token_embd.weight"], inp.tokens), math.sqrt(c.n_embd))
        all_rows = len(inp.output_rows) == n
        for il in range(c.n_layer):
            p = f"blk.{il}."
            h = self._attention(
                il, b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps), inp, attention
            )
            h = b.rms_norm(h, w[p + "post_attention_norm.weight"], c.rms_eps)
            if il == c.n_layer - 1 and not all_rows:
                h = b.get_rows(h, inp.output_rows)
                x = b.get_rows(x, inp.output_rows)
            x = b.add(x, h)
            h = b.rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)
            gate = b.gelu(b.matmul(h, w[p + "ffn_gate.weight"]))
            h = b.matmul(b.mul(gate, b.matmul(h, w[p + "ffn_up.weight"])), w[p + "ffn_down.weight"])
            x = b.add(x, b.rms_norm(h, w[p + "post_ffw_norm.weight"], c.rms_eps))
        return b.rms_norm(x, w["output_norm.weight"], c.rms_eps)

"""The forward pass of a llama-family model: pre-norm decoder blocks over backend ops.

Per layer: RMSNorm -> Q/K/V (optional biases, optional per-head Q/K norm) -> RoPE -> the
K/V write and attention over the KV view -> output projection -> residual -> RMSNorm ->
SwiGLU FFN -> residual; then the final norm and the LM head for the rows that need
logits. At decode, a whole layer runs as one call where a block fusion serves the backend
(:data:`tessera.contract.fusion.LLAMA_DECODER`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tessera.contract.arch import ForwardInput
from tessera.contract.fusion import LLAMA_DECODER, DecoderBlock
from tessera.models.llama.config import LlamaConfig


class LlamaGraph:
    """The forward pass of a llama-family model on one backend."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = config
        self.w = weights
        self.b = backend
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.attn_scale = 1.0 / math.sqrt(config.head_dim)
        #: When a list, each forward appends its output rows' last hidden state to it.
        self.hidden_sink: list[Any] | None = None
        self._blocks: list[DecoderBlock] | None = None  # made on the first decode step
        # Asked once, when the model loads (so switches read then apply to this model).
        # A subclass that changes a block (tensor parallel, MoE FFNs) runs its own ops.
        same = type(self)._attention is LlamaGraph._attention
        same = same and type(self)._ffn is LlamaGraph._ffn
        self._fusion = backend.fusion(LLAMA_DECODER) if same else None

    def _project(self, x: Any, name: str) -> Any:
        y = self.b.matmul(x, self.w[name + ".weight"])
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.b.add(y, bias)

    def _attention(self, il: int, x: Any, inp: ForwardInput) -> Any:
        b, c, p = self.b, self.c, f"blk.{il}."
        n_tokens = len(inp.tokens)
        names = (p + "attn_q", p + "attn_k", p + "attn_v")
        q, k, v = b.matmul_n(
            x, [self.w[n + ".weight"] for n in names], [self.w.get(n + ".bias") for n in names]
        )
        q = q.reshape(n_tokens, c.n_head, c.head_dim)
        k = k.reshape(n_tokens, c.n_head_kv, c.head_dim)
        v = v.reshape(n_tokens, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = b.rms_norm(q, self.w[p + "attn_q_norm.weight"], c.rms_eps)
            k = b.rms_norm(k, self.w[p + "attn_k_norm.weight"], c.rms_eps)
        q = b.rope(q, inp.positions, c.head_dim, c.rope_freq_base, c.rope_neox, c.rope_freq_scale)
        k = b.rope(k, inp.positions, c.head_dim, c.rope_freq_base, c.rope_neox, c.rope_freq_scale)
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v)
        out = kv.attend(b, il, q, self.attn_scale)
        return self._project(out, p + "attn_output")

    def forward(self, inp: ForwardInput) -> Any:
        b, c = self.b, self.c
        x = b.get_rows(self.w["token_embd.weight"], inp.tokens)
        all_rows = len(inp.output_rows) == len(inp.tokens)
        kv = inp.kv
        decode = len(inp.tokens) == 1 and all_rows and kv.path == "rows"
        blocks = self._decoder_blocks() if decode else None
        rows, cell = (kv.rows_for(), int(kv.cells[0])) if blocks is not None else (None, 0)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            if blocks is not None:
                # decode: the whole block in one call where a fusion serves this backend
                y = self._fusion.run(
                    b, x, blocks[il], kv.k[il], kv.v[il], cell, rows, inp.positions
                )
                if y is not None:
                    x = y
                    continue
            attn = self._attention(
                il, b.rms_norm(x, self.w[p + "attn_norm.weight"], c.rms_eps), inp
            )
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows that need logits go through the last FFN and the head.
                attn = b.get_rows(attn, inp.output_rows)
                x = b.get_rows(x, inp.output_rows)
            x = b.add(x, attn)
            h = b.rms_norm(x, self.w[p + "ffn_norm.weight"], c.rms_eps)
            x = b.add(x, self._ffn(il, h))
        if self.hidden_sink is not None:
            self.hidden_sink.append(x)  # MTP drafting reads h_i before the final norm
        x = b.rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        return self._logits(x)

    def _decoder_blocks(self) -> list[DecoderBlock] | None:
        """Each layer as a :class:`DecoderBlock` for the backend's block fusion, made
        once; None when no fusion serves this model."""
        if self._fusion is None:
            return None
        if self._blocks is None:
            self._blocks = [self._decoder_block(il) for il in range(self.c.n_layer)]
        return self._blocks

    def _decoder_block(self, il: int) -> DecoderBlock:
        c, w, p = self.c, self.w, f"blk.{il}."
        return DecoderBlock(
            attn_norm=w[p + "attn_norm.weight"],
            wq=w[p + "attn_q.weight"],
            wk=w[p + "attn_k.weight"],
            wv=w[p + "attn_v.weight"],
            wo=w[p + "attn_output.weight"],
            ffn_norm=w[p + "ffn_norm.weight"],
            w_gate=w[p + "ffn_gate.weight"],
            w_up=w[p + "ffn_up.weight"],
            w_down=w[p + "ffn_down.weight"],
            bq=w.get(p + "attn_q.bias"),
            bk=w.get(p + "attn_k.bias"),
            bv=w.get(p + "attn_v.bias"),
            q_norm=w.get(p + "attn_q_norm.weight") if c.qk_norm else None,
            k_norm=w.get(p + "attn_k_norm.weight") if c.qk_norm else None,
            n_head=c.n_head,
            n_head_kv=c.n_head_kv,
            head_dim=c.head_dim,
            n_rot=c.head_dim,
            rms_eps=c.rms_eps,
            rope_freq_base=c.rope_freq_base,
            rope_freq_scale=c.rope_freq_scale,
            rope_neox=c.rope_neox,
            attn_scale=self.attn_scale,
        )

    def _ffn(self, il: int, h: Any) -> Any:
        """SwiGLU FFN of layer ``il`` (tensor parallel overrides it to sum partial outputs)."""
        b, p = self.b, f"blk.{il}."
        act = b.gate_up_swiglu(h, self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"])
        return b.matmul(act, self.w[p + "ffn_down.weight"])

    def _logits(self, x: Any) -> Any:
        """The LM head over normalized hidden states (tensor parallel may split it by vocab)."""
        return self.b.matmul(x, self.output)

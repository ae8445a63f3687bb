"""The forward pass of a llama-family model: decoder blocks over backend ops.

Per layer: RMSNorm -> Q/K/V (optional biases, optional Q/K norm per head or over the whole
projection) -> RoPE (none on NoPE layers; factors and a magnitude scale for llama3, YaRN
and LongRoPE) -> the K/V write and attention over the KV view (within the sliding window
where there is one) -> output projection -> residual -> RMSNorm -> SwiGLU FFN -> residual;
then the final norm and the LM head for the rows that need logits. OLMo 2 normalizes after
attention and the FFN instead of before; Granite scales the embeddings, the residual
branches and the logits. At decode, a whole layer runs as one call where a block fusion
serves the backend and the block is one :data:`tessera.contract.fusion.LLAMA_DECODER`
describes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.contract.fusion import LLAMA_DECODER, DecoderBlock
from tessera.models.llama import rope
from tessera.models.llama.config import TRAITS, LlamaConfig


def fusable(c: LlamaConfig) -> bool:
    """Whether every layer is a plain :class:`DecoderBlock` (a fusion runs nothing else)."""
    return not (
        c.n_swa
        or c.nope_layers
        or rope.needs_rope_ext(c.rope_scaling)
        or c.attn_temp_scale
        or c.residual_scale != 1.0
        or c.post_norms
        or not c.pre_norms
        or c.qk_norm_full
        or c.fused_qkv
        or c.fused_gate_up
    )


class LlamaGraph:
    """The forward pass of a llama-family model on one backend."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = c = config
        self.w = weights
        self.b = backend
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.attn_scale = c.attention_scale or 1.0 / math.sqrt(c.head_dim)
        self.ffn_norm = TRAITS[c.arch].ffn_norm + ".weight"
        #: When a list, each forward appends its output rows' last hidden state to it (the
        #: MTP block's input: after output_norm where nextn_normed_h says so).
        self.hidden_sink: list[Any] | None = None
        self.nextn_normed_h = TRAITS[c.arch].nextn_normed_h
        self._blocks: list[DecoderBlock] | None = None  # made on the first decode step
        # RoPE factor tensors as host data, and each layer's rotation by context size
        names = rope.factor_shapes(c.rope_scaling, c.n_rot)
        self._factors = {n: np.asarray(backend.to_numpy(weights[n]), np.float64) for n in names}
        self._rope: dict[int, list[rope.RopeArgs | None]] = {}
        # Asked once, when the model loads (so switches read then apply to this model).
        # A subclass that changes a block (tensor parallel, MoE FFNs) runs its own ops.
        same = type(self)._attention is LlamaGraph._attention
        same = same and type(self)._ffn is LlamaGraph._ffn and fusable(c)
        self._fusion = backend.fusion(LLAMA_DECODER) if same else None

    def _project(self, x: Any, name: str) -> Any:
        y = self.b.matmul(x, self.w[name + ".weight"])
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.b.add(y, bias)

    def _rope_of(self, il: int, inp: ForwardInput) -> rope.RopeArgs | None:
        """Layer ``il``'s rotation; LongRoPE's factors depend on the context's size."""
        cache = getattr(inp.kv, "cache", None)
        n_ctx_seq = cache.n_ctx_seq if cache is not None else self.c.n_ctx_train
        if n_ctx_seq not in self._rope:
            n_blocks = self.c.n_layer + self.c.n_nextn  # MTP blocks attend like the others
            self._rope[n_ctx_seq] = [
                rope.rope_args(self.c, i, self._factors, n_ctx_seq) for i in range(n_blocks)
            ]
        return self._rope[n_ctx_seq][il]

    def _qkv(self, il: int, x: Any) -> tuple[Any, Any, Any]:
        b, c, p = self.b, self.c, f"blk.{il}."
        if c.fused_qkv:  # Phi-3: one projection, Q rows then K rows then V rows
            y = self._project(x, p + "attn_qkv")
            return y[:, : c.q_dim], y[:, c.q_dim : c.q_dim + c.kv_dim], y[:, c.q_dim + c.kv_dim :]
        names = (p + "attn_q", p + "attn_k", p + "attn_v")
        return b.matmul_n(
            x, [self.w[n + ".weight"] for n in names], [self.w.get(n + ".bias") for n in names]
        )

    def _attention(self, il: int, x: Any, inp: ForwardInput) -> Any:
        b, c, p = self.b, self.c, f"blk.{il}."
        n_tokens = len(inp.tokens)
        q, k, v = self._qkv(il, x)
        if c.qk_norm_full:  # OLMo 2: over every head at once
            q = b.rms_norm(q, self.w[p + "attn_q_norm.weight"], c.rms_eps)
            k = b.rms_norm(k, self.w[p + "attn_k_norm.weight"], c.rms_eps)
        q = q.reshape(n_tokens, c.n_head, c.head_dim)
        k = k.reshape(n_tokens, c.n_head_kv, c.head_dim)
        v = v.reshape(n_tokens, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = b.rms_norm(q, self.w[p + "attn_q_norm.weight"], c.rms_eps)
            k = b.rms_norm(k, self.w[p + "attn_k_norm.weight"], c.rms_eps)
        rotation = self._rope_of(il, inp)
        if rotation is not None:  # None: a NoPE layer
            q = rotation.apply(b, q, inp.positions)
            k = rotation.apply(b, k, inp.positions)
        if c.attn_temp_scale:
            q = b.mul(q, b.from_numpy(self._temperature(inp.positions)))
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v)
        out = kv.attend(b, il, q, self.attn_scale, c.n_swa)
        return self._project(out, p + "attn_output")

    def _temperature(self, positions: np.ndarray) -> np.ndarray:
        """Ministral 3's per-position Q scale ``(T, 1, 1)``: longer reach, sharper attention."""
        step = self.c.rope_scaling.n_ctx_orig or self.c.n_ctx_train
        scale = 1.0 + self.c.attn_temp_scale * np.log1p(np.floor(positions / step))
        return scale.astype(np.float32)[:, None, None]

    def _layer(self, il: int, x: Any, inp: ForwardInput, prune: bool) -> Any:
        """One decoder layer; with ``prune`` only the output rows leave it."""
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        h = b.rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps) if c.pre_norms else x
        attn = self._attention(il, h, inp)
        if c.post_norms:
            attn = b.rms_norm(attn, w[p + "post_attention_norm.weight"], c.rms_eps)
        if prune:
            # Only the rows that need logits go through the last FFN and the head.
            attn = b.get_rows(attn, inp.output_rows)
            x = b.get_rows(x, inp.output_rows)
        x = b.add(x, self._residual(attn))
        h = b.rms_norm(x, w[p + self.ffn_norm], c.rms_eps) if c.pre_norms else x
        out = self._ffn(il, h)
        if c.post_norms:
            out = b.rms_norm(out, w[p + "post_ffw_norm.weight"], c.rms_eps)
        return b.add(x, self._residual(out))

    def nextn_block(self, il: int, x: Any, inp: ForwardInput) -> Any:
        """Block ``il`` (an MTP block after the main ones) over the residual stream ``x``."""
        return self._layer(il, x, inp, prune=False)

    def _residual(self, branch: Any) -> Any:
        s = self.c.residual_scale
        return branch if s == 1.0 else self.b.scale(branch, s)

    def forward(self, inp: ForwardInput) -> Any:
        b, c = self.b, self.c
        x = b.get_rows(self.w["token_embd.weight"], inp.tokens)
        if c.embedding_scale != 1.0:
            x = b.scale(x, c.embedding_scale)
        all_rows = len(inp.output_rows) == len(inp.tokens)
        kv = inp.kv
        decode = len(inp.tokens) == 1 and all_rows and kv.path == "rows"
        blocks = self._decoder_blocks() if decode else None
        rows, cell = (kv.rows_for(), int(kv.cells[0])) if blocks is not None else (None, 0)
        for il in range(c.n_layer):
            if blocks is not None:
                # decode: the whole block in one call where a fusion serves this backend
                y = self._fusion.run(
                    b, x, blocks[il], kv.k[il], kv.v[il], cell, rows, inp.positions
                )
                if y is not None:
                    x = y
                    continue
            x = self._layer(il, x, inp, prune=il == c.n_layer - 1 and not all_rows)
        if self.hidden_sink is not None and not self.nextn_normed_h:
            self.hidden_sink.append(x)  # MTP drafting reads h_i before the final norm
        x = b.rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        if self.hidden_sink is not None and self.nextn_normed_h:
            self.hidden_sink.append(x)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        logits = self._logits(x)
        return logits if c.logit_scale == 1.0 else b.scale(logits, 1.0 / c.logit_scale)

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
            n_rot=c.n_rot,
            rms_eps=c.rms_eps,
            rope_freq_base=c.rope_freq_base,
            rope_freq_scale=c.rope_freq_scale,
            rope_neox=c.rope_neox,
            attn_scale=self.attn_scale,
        )

    def _ffn(self, il: int, h: Any) -> Any:
        """SwiGLU FFN of layer ``il`` (tensor parallel overrides it to sum partial outputs)."""
        b, c, p = self.b, self.c, f"blk.{il}."
        if c.fused_gate_up:  # Phi-3, GLM-4: gate rows then up rows in one tensor
            gate_up = b.matmul(h, self.w[p + "ffn_up.weight"])
            act = b.swiglu(gate_up[:, : c.n_ff], gate_up[:, c.n_ff :])
        else:
            act = b.gate_up_swiglu(h, self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"])
        return b.matmul(act, self.w[p + "ffn_down.weight"])

    def _logits(self, x: Any) -> Any:
        """The LM head over normalized hidden states (tensor parallel may split it by vocab)."""
        return self.b.matmul(x, self.output)

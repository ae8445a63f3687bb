"""Multi-head latent attention (MLA) as llama.cpp runs it for ``deepseek2``: the KV cache
holds one compressed latent per token and the query is taken into the latent's space.

Per token, with ``H`` query heads::

    q        = W_q x  or  W_qb norm(W_qa x)                (H heads of nope + rope values)
    c, k_pe  = W_kva x                                     (the latent, one RoPE key part)
    c        = norm(c);  k_pe = rope(k_pe);  q_pe = rope(q_pe)
    K = V    = [c ; k_pe]  (one head: MQA; V is the latent, K's first kv_lora values)
    Q_h      = [k_b_h q_nope_h ; q_pe_h]                   (k_b: a head's no-RoPE key from c)
    o_h      = v_b_h attention(Q_h, K, V)                  (v_b: a head's value from c)
    out      = W_o [o_1 ... o_H]

which equals attention over the decompressed per-head keys ``[k_b_h^T c ; k_pe]`` and
values ``v_b_h c`` (kv_b_proj), without making them. The score scale is DeepSeek's YaRN
``mscale^2 / sqrt(nope + rope)``; RoPE turns adjacent pairs (GGML normal mode) and under
YaRN blends per pair (:mod:`tessera.contract.yarn`), its magnitude scale cancelled as
llama.cpp cancels it (``attn_factor``, 1 for DeepSeek's equal ``mscale`` values).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.contract.rope import RopeArgs
from tessera.contract.yarn import yarn_divisors, yarn_mscale
from tessera.models.deepseek2.config import DeepSeek2Config


def kq_scale(c: DeepSeek2Config) -> float:
    """llama.cpp's attention score scale: YaRN's ``mscale_all_dim`` magnitude, squared,
    over ``sqrt`` of a decompressed head's width."""
    mscale = c.rope_attn_factor * yarn_mscale(1.0 / c.rope_freq_scale, c.mscale_all_dim)
    return mscale * mscale / math.sqrt(c.head_dim_k)


class MLAttention:
    """The attention half of every block of one model on one backend."""

    def __init__(self, c: DeepSeek2Config, weights: Mapping[str, Any], backend: Any) -> None:
        self.c, self.w, self.b = c, weights, backend
        self.scale = kq_scale(c)
        # GGML normal-mode RoPE; scaled, it is stretched by YaRN's blend (per-pair divisors)
        divisors = None
        if c.rope_freq_scale != 1.0:
            divisors = yarn_divisors(
                c.n_rot, c.rope_freq_base, c.rope_freq_scale, c.n_ctx_orig or c.n_ctx_train,
                c.yarn_beta_fast, c.yarn_beta_slow,
            )  # fmt: skip
        self.rotation = RopeArgs(
            c.n_rot, c.rope_freq_base, 1.0, False, divisors, mscale=c.rope_attn_factor
        )

    def rope(self, x: Any, positions: np.ndarray) -> Any:
        """RoPE over all of ``x`` ``(T, H, n_rot)``."""
        return self.rotation.apply(self.b, x, positions)

    def _query(self, il: int, x: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        if not c.q_lora_rank:  # V2-Lite: one projection
            return b.matmul(x, w[p + "attn_q.weight"])
        q = b.rms_norm(
            b.matmul(x, w[p + "attn_q_a.weight"]), w[p + "attn_q_a_norm.weight"], c.rms_eps
        )
        return b.matmul(q, w[p + "attn_q_b.weight"])

    def __call__(self, il: int, x: Any, inp: ForwardInput) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n_tokens, lora, nope = len(inp.tokens), c.kv_lora_rank, c.qk_nope_dim
        q = self._query(il, x).reshape(n_tokens, c.n_head, c.head_dim_k)
        kv = b.matmul(x, w[p + "attn_kv_a_mqa.weight"])  # the latent, then the RoPE key
        latent = b.rms_norm(kv[:, :lora], w[p + "attn_kv_a_norm.weight"], c.rms_eps)
        k_pe = self.rope(kv[:, lora:].reshape(n_tokens, 1, c.n_rot), inp.positions)
        b.set_rows(inp.kv.k[il], inp.kv.cells, b.concat([latent.reshape(n_tokens, 1, lora), k_pe]))
        q_latent = b.matmul_heads(q[:, :, :nope], w[p + "attn_k_b.weight"])
        q = b.concat([q_latent, self.rope(q[:, :, nope:], inp.positions)])
        out = inp.kv.attend(b, il, q, self.scale).reshape(n_tokens, c.n_head, lora)
        out = b.matmul_heads(out, w[p + "attn_v_b.weight"])
        return b.matmul(out.reshape(n_tokens, c.n_head * c.v_head_dim), w[p + "attn_output.weight"])

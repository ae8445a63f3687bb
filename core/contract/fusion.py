"""The weights and shape of one llama-family decoder block, for the ``decoder_block`` op.

A backend that runs a whole pre-norm block (RMSNorm, grouped-query attention with RoPE,
SwiGLU FFN) in one call for a decode step answers True to ``supports("decoder_block")``;
architectures hand it a :class:`DecoderBlock` per layer (see
:meth:`tessera.contract.backend.Backend.decoder_block`).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(eq=False)
class DecoderBlock:
    """One layer: loaded weights (``None`` where the model has none) and its shape.

    ``x -> x + attn(norm(x))``, then ``x -> x + ffn(norm(x))``, where ``attn`` projects
    Q/K/V (plus biases), applies per-head RMSNorm to Q and K when ``q_norm``/``k_norm`` are
    given, rotates the first ``n_rot`` values of each head (``rope_neox``: pairs ``(j, j +
    n_rot/2)``, else ``(2j, 2j+1)``), attends with ``attn_scale`` and projects by ``wo``;
    ``ffn`` is ``w_down(silu(w_gate h) * w_up h)``.
    """

    attn_norm: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: Any
    w_gate: Any
    w_up: Any
    w_down: Any
    bq: Any | None
    bk: Any | None
    bv: Any | None
    q_norm: Any | None
    k_norm: Any | None
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    rope_neox: bool
    attn_scale: float

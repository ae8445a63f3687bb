"""Block fusions: a whole block of an architecture in one backend call.

A block fusion is keyed by what it serves: a backend (by name) and a kind of block. A
plugin registers a :class:`BlockFusion` (hook ``tessera_register_block_fusions``); the
loader hands a backend every fusion registered for it (``Backend.use_fusions``), and an
architecture asks ``backend.fusion(kind)`` for the kind of block it builds, getting the
fusion when its probe passes here, else None (the architecture then runs the block's ops).

The one kind of block today is :data:`LLAMA_DECODER`: a llama-family pre-norm decoder
layer for one decode token, described by a :class:`DecoderBlock`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

#: A llama-family decoder layer (RMSNorm, grouped-query attention with RoPE, SwiGLU FFN)
#: for one decode token. ``run(backend, x, block, k_cache, v_cache, cell, kv_rows,
#: positions)``: ``x`` ``(1, n_embd)`` the token's hidden state, ``block`` a
#: :class:`DecoderBlock`, ``k_cache``/``v_cache`` the layer's ``(C, Hkv, D)`` caches,
#: ``cell`` the cache cell the token's rotated K and its V go to, ``kv_rows`` the token's
#: :class:`tessera.engine.kv_view.KVRows` (as ``attention_rows`` gets them), ``positions``
#: its position ``(1,)``; returns ``(1, n_embd)`` with K/V written, or None.
LLAMA_DECODER = "llama-decoder"

#: Every kind of block a fusion can serve (the conformance kit has cases for each).
BLOCK_KINDS = (LLAMA_DECODER,)


@attrs.frozen
class BlockFusion:
    """What a fusion plugin registers: a whole block of kind ``block`` on ``backend``.

    ``probe(backend)`` says whether the fusion serves that backend instance (its dtype,
    the CPU's kernels, a switch); it is asked when an architecture builds its graph.
    ``run(backend, *inputs)`` takes the inputs the kind of block defines (see
    :data:`LLAMA_DECODER`) and returns the block's output, or None — with nothing
    written — when it cannot run this block or this step (the architecture then runs
    the ops). The result must equal the block's ops, rounding aside.
    """

    backend: str
    block: str
    run: Callable[..., Any] = attrs.field(eq=False, repr=False)
    probe: Callable[[Any], bool] = attrs.field(default=lambda backend: True, eq=False, repr=False)
    description: str = ""


@attrs.frozen(eq=False)
class DecoderBlock:
    """One :data:`LLAMA_DECODER` layer: loaded weights (``None`` where the model has none)
    and its shape.

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

"""Conformance cases of the :data:`~tessera.contract.fusion.LLAMA_DECODER` block fusion for
one decode token, and the same block composed of core ops: the reference, and the path of
a backend without the fusion or whose fusion declines the call."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.contract.fusion import LLAMA_DECODER, DecoderBlock
from tessera.testing.conformance.arrays import flat, normal
from tessera.testing.conformance.kit import Case, Weight

#: ``decoder_block`` shape: width, query heads, KV heads, head size, FFN size, cache cells,
#: cells of the sequence (the decoded token is the last).
_BLOCK = (64, 4, 2, 16, 96, 12, 9)


def decoder_block_cases(qtypes: list[Any]) -> list[Case]:
    """``decoder_block`` for one decode token: Qwen2-style (Q/K/V biases, NeoX RoPE) and
    Qwen3-style (per-head Q/K RMSNorm, pairs (2j, 2j+1)); weights in F16, Q8_0, Q4_0. The
    result is the block's output and the token's cache cell (K rotated, V); a backend
    that declines the call (None) is checked on the ops it falls back to."""
    cases = []
    for qt in (q for q in qtypes if q.name in ("F16", "Q8_0", "Q4_0")):
        for style in ("qwen2", "qwen3"):
            cases.append(
                Case(
                    f"decoder_block-{style}-{qt.name}",
                    LLAMA_DECODER,
                    {"quant_type": qt.name},
                    lambda rng, qt=qt, style=style: _block_inputs(rng, qt, style),
                    _block_call,
                    (_BLOCK[0] + 2 * _BLOCK[2] * _BLOCK[3],),
                    supported=lambda b: b.fusion(LLAMA_DECODER) is not None,
                )
            )
    return cases


def _block_inputs(rng: np.random.Generator, qt: Any, style: str) -> dict[str, Any]:
    from tessera.engine.kv_cache import KVCache

    n_embd, n_head, n_head_kv, head_dim, n_ff, n_cells, n_seq = _BLOCK
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    shapes = {"wq": q_dim, "wk": kv_dim, "wv": kv_dim, "w_gate": n_ff, "w_up": n_ff}
    args: dict[str, Any] = {
        name: Weight(normal(rng, n, n_embd, scale=0.2), qt) for name, n in shapes.items()
    }
    args["wo"] = Weight(normal(rng, n_embd, q_dim, scale=0.2), qt)
    args["w_down"] = Weight(normal(rng, n_embd, n_ff, scale=0.2), qt)
    args["attn_norm"] = 1 + normal(rng, n_embd, scale=0.1)
    args["ffn_norm"] = 1 + normal(rng, n_embd, scale=0.1)
    if style == "qwen2":
        for name, n in (("bq", q_dim), ("bk", kv_dim), ("bv", kv_dim)):
            args[name] = normal(rng, n, scale=0.5)
    else:
        args["q_norm"] = 1 + normal(rng, head_dim, scale=0.1)
        args["k_norm"] = 1 + normal(rng, head_dim, scale=0.1)
    cache = KVCache(None, [None], n_cells, 1)  # cell bookkeeping only
    cells = cache.find_slot(n_seq)
    cache.commit(cells, np.arange(n_seq), np.zeros(n_seq, dtype=int))
    k, v = normal(rng, n_cells, n_head_kv, head_dim), normal(rng, n_cells, n_head_kv, head_dim)
    unused = np.setdiff1d(np.arange(n_cells), cells)
    k[unused] = v[unused] = np.nan  # a block that reads a cell of no sequence fails
    positions = np.array([n_seq - 1])
    args.update(
        x=normal(rng, 1, n_embd),
        k=k,
        v=v,
        cell=int(cells[-1]),
        positions=positions,
        rows=cache.rows(positions, np.array([0]), cache.n_kv()),
        style=style,
    )
    return args


def _block_call(b: Any, a: dict[str, Any]) -> Any:
    _, n_head, n_head_kv, head_dim, *_ = _BLOCK
    block = DecoderBlock(
        **{n: a[n] for n in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm")},
        **{n: a[n] for n in ("w_gate", "w_up", "w_down")},
        **{n: a.get(n) for n in ("bq", "bk", "bv", "q_norm", "k_norm")},
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=head_dim,
        rms_eps=1e-6,
        rope_freq_base=10000.0,
        rope_freq_scale=1.0,
        rope_neox=a["style"] == "qwen2",
        attn_scale=1.0 / np.sqrt(head_dim),
    )
    y, fusion = None, b.fusion(LLAMA_DECODER)
    if fusion is not None:
        y = fusion.run(b, a["x"], block, a["k"], a["v"], a["cell"], a["rows"], a["positions"])
    if y is None:
        y = _block_by_ops(b, a["x"], block, a)
    return flat(b, [y, *b.get_n([a["k"], a["v"]], [np.array([a["cell"]])] * 2)])


def _block_by_ops(b: Any, x: Any, blk: Any, a: dict[str, Any]) -> Any:
    """The block from core ops: the reference, and the path of a backend that declines."""
    h = b.rms_norm(x, blk.attn_norm, blk.rms_eps)
    q, k, v = b.matmul_n(h, [blk.wq, blk.wk, blk.wv], [blk.bq, blk.bk, blk.bv])
    q, k = q.reshape(1, blk.n_head, blk.head_dim), k.reshape(1, blk.n_head_kv, blk.head_dim)
    if blk.q_norm is not None:
        q, k = b.rms_norm(q, blk.q_norm, blk.rms_eps), b.rms_norm(k, blk.k_norm, blk.rms_eps)
    rope = (blk.n_rot, blk.rope_freq_base, blk.rope_neox, blk.rope_freq_scale)
    q, k = b.rope(q, a["positions"], *rope), b.rope(k, a["positions"], *rope)
    cell = np.array([a["cell"]])
    b.set_rows(a["k"], cell, k)
    b.set_rows(a["v"], cell, v.reshape(1, blk.n_head_kv, blk.head_dim))
    n_kv = int(a["rows"].rows.max()) + 1  # the cells past it hold NaN
    seen = np.isin(np.arange(n_kv), a["rows"].rows[0])[None]
    out = b.attention(q, a["k"], a["v"], n_kv, seen, blk.attn_scale)
    x = b.add(x, b.matmul(out, blk.wo))
    h = b.rms_norm(x, blk.ffn_norm, blk.rms_eps)
    gate, up = b.matmul_n(h, [blk.w_gate, blk.w_up])
    return b.add(x, b.matmul(b.swiglu(gate, up), blk.w_down))

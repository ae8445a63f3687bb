"""Every GGUF tensor of a llama-family model and its numpy-order shape, by config."""

from __future__ import annotations

from tessera.models.llama.config import TRAITS, LlamaConfig
from tessera.models.llama.rope import factor_shapes


def tensor_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a dense model of config ``c`` has (llama.cpp's names)."""
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, c.n_embd)}
    shapes |= factor_shapes(c.rope_scaling, c.n_rot)
    for i in range(c.n_layer):
        shapes |= _attention_shapes(c, f"blk.{i}.")
        shapes |= _ffn_shapes(c, f"blk.{i}.")
    shapes |= nextn_tensor_shapes(c)
    shapes["output_norm.weight"] = (c.n_embd,)
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.n_vocab, c.n_embd)
    return shapes


def _attention_shapes(c: LlamaConfig, p: str) -> dict[str, tuple[int, ...]]:
    q, kv, e = c.q_dim, c.kv_dim, c.n_embd
    shapes: dict[str, tuple[int, ...]] = {}
    if c.pre_norms:
        shapes[p + "attn_norm.weight"] = (e,)
    if c.post_norms:
        shapes[p + "post_attention_norm.weight"] = (e,)
    if c.fused_qkv:
        shapes[p + "attn_qkv.weight"] = (q + 2 * kv, e)
    else:
        shapes |= {p + "attn_q.weight": (q, e), p + "attn_k.weight": (kv, e)}
        shapes[p + "attn_v.weight"] = (kv, e)
    if c.attn_bias:
        shapes |= {p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)}
    if c.qk_norm:
        shapes |= {p + "attn_q_norm.weight": (c.head_dim,), p + "attn_k_norm.weight": (c.head_dim,)}
    if c.qk_norm_full:
        shapes |= {p + "attn_q_norm.weight": (q,), p + "attn_k_norm.weight": (kv,)}
    shapes[p + "attn_output.weight"] = (e, q)
    return shapes


def _ffn_shapes(c: LlamaConfig, p: str) -> dict[str, tuple[int, ...]]:
    e, f = c.n_embd, c.n_ff
    shapes: dict[str, tuple[int, ...]] = {}
    if c.pre_norms:
        shapes[p + TRAITS[c.arch].ffn_norm + ".weight"] = (e,)
    if c.post_norms:
        shapes[p + "post_ffw_norm.weight"] = (e,)
    if c.fused_gate_up:
        shapes[p + "ffn_up.weight"] = (2 * f, e)  # gate rows, then up rows
    else:
        shapes |= {p + "ffn_gate.weight": (f, e), p + "ffn_up.weight": (f, e)}
    shapes[p + "ffn_down.weight"] = (e, f)
    return shapes


def nextn_tensor_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Tensors of the MTP blocks ``blk.{n_layer + i}``: a decoder block like the model's
    others plus llama.cpp's ``nextn.*`` tensors (the embedding and output head are the
    model's own)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(c.n_layer, c.n_layer + c.n_nextn):
        p = f"blk.{i}."
        shapes |= _attention_shapes(c, p) | _ffn_shapes(c, p)
        shapes[p + "nextn.eh_proj.weight"] = (c.n_embd, 2 * c.n_embd)
        shapes[p + "nextn.enorm.weight"] = (c.n_embd,)
        shapes[p + "nextn.hnorm.weight"] = (c.n_embd,)
        shapes[p + "nextn.shared_head_norm.weight"] = (c.n_embd,)
    return shapes

"""Every GGUF tensor of a Qwen3-Next model and its numpy-order shape, by config
(llama.cpp's ``qwen3next`` names)."""

from __future__ import annotations

from tessera.models.qwen3_next.config import Qwen3NextConfig


def tensor_shapes(c: Qwen3NextConfig) -> dict[str, tuple[int, ...]]:
    e = c.n_embd
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, e)}
    for il in range(c.n_layer):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = (e,)
        shapes |= _delta_net_shapes(c, p) if c.recurrent[il] else _attention_shapes(c, p)
        shapes[p + "post_attention_norm.weight"] = (e,)
        shapes |= _moe_shapes(c, p)
    shapes["output_norm.weight"] = (e,)
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.n_vocab, e)
    return shapes


def _delta_net_shapes(c: Qwen3NextConfig, p: str) -> dict[str, tuple[int, ...]]:
    e, nv = c.n_embd, c.n_v_heads
    return {
        p + "attn_qkv.weight": (c.conv_dim, e),
        p + "attn_gate.weight": (c.value_dim, e),
        p + "ssm_ba.weight": (2 * nv, e),
        p + "ssm_conv1d.weight": (c.conv_dim, c.conv_kernel),
        p + "ssm_dt.bias": (nv,),
        p + "ssm_a": (nv,),
        p + "ssm_norm.weight": (c.v_head_dim,),
        p + "ssm_out.weight": (e, c.value_dim),
    }


def _attention_shapes(c: Qwen3NextConfig, p: str) -> dict[str, tuple[int, ...]]:
    e, d = c.n_embd, c.head_dim
    return {
        p + "attn_q.weight": (2 * c.n_head * d, e),  # each head's query, then its gate
        p + "attn_k.weight": (c.n_head_kv * d, e),
        p + "attn_v.weight": (c.n_head_kv * d, e),
        p + "attn_output.weight": (e, c.n_head * d),
        p + "attn_q_norm.weight": (d,),
        p + "attn_k_norm.weight": (d,),
    }


def _moe_shapes(c: Qwen3NextConfig, p: str) -> dict[str, tuple[int, ...]]:
    e, f, n, fs = c.n_embd, c.n_ff_exp, c.n_expert, c.n_ff_shexp
    return {
        p + "ffn_gate_inp.weight": (n, e),
        p + "ffn_gate_exps.weight": (n, f, e),
        p + "ffn_up_exps.weight": (n, f, e),
        p + "ffn_down_exps.weight": (n, e, f),
        p + "ffn_gate_inp_shexp.weight": (1, e),
        p + "ffn_gate_shexp.weight": (fs, e),
        p + "ffn_up_shexp.weight": (fs, e),
        p + "ffn_down_shexp.weight": (e, fs),
    }

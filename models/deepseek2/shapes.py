"""Every GGUF tensor of a DeepSeek-V2/V3 model and its numpy-order shape, by config
(llama.cpp's ``deepseek2`` names)."""

from __future__ import annotations

from tessera.models.deepseek2.config import DeepSeek2Config


def tensor_shapes(c: DeepSeek2Config) -> dict[str, tuple[int, ...]]:
    e = c.n_embd
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, e)}
    for il in range(c.n_layer):
        p = f"blk.{il}."
        shapes |= _attention_shapes(c, p)
        shapes[p + "ffn_norm.weight"] = (e,)
        shapes |= _moe_shapes(c, p) if c.is_moe_layer(il) else _dense_shapes(c, p)
    shapes["output_norm.weight"] = (e,)
    if not c.tied_embeddings:
        shapes["output.weight"] = (c.n_vocab, e)
    return shapes


def _attention_shapes(c: DeepSeek2Config, p: str) -> dict[str, tuple[int, ...]]:
    e, h, lora = c.n_embd, c.n_head, c.kv_lora_rank
    shapes: dict[str, tuple[int, ...]] = {p + "attn_norm.weight": (e,)}
    if c.q_lora_rank:
        shapes[p + "attn_q_a.weight"] = (c.q_lora_rank, e)
        shapes[p + "attn_q_a_norm.weight"] = (c.q_lora_rank,)
        shapes[p + "attn_q_b.weight"] = (h * c.head_dim_k, c.q_lora_rank)
    else:
        shapes[p + "attn_q.weight"] = (h * c.head_dim_k, e)
    return shapes | {
        p + "attn_kv_a_mqa.weight": (lora + c.n_rot, e),
        p + "attn_kv_a_norm.weight": (lora,),
        p + "attn_k_b.weight": (h, lora, c.qk_nope_dim),
        p + "attn_v_b.weight": (h, c.v_head_dim, lora),
        p + "attn_output.weight": (e, h * c.v_head_dim),
    }


def _dense_shapes(c: DeepSeek2Config, p: str) -> dict[str, tuple[int, ...]]:
    e, f = c.n_embd, c.n_ff
    return {
        p + "ffn_gate.weight": (f, e),
        p + "ffn_up.weight": (f, e),
        p + "ffn_down.weight": (e, f),
    }


def _moe_shapes(c: DeepSeek2Config, p: str) -> dict[str, tuple[int, ...]]:
    e, f, n = c.n_embd, c.n_ff_exp, c.n_expert
    shapes: dict[str, tuple[int, ...]] = {p + "ffn_gate_inp.weight": (n, e)}
    if c.expert_bias:
        shapes[p + "exp_probs_b.bias"] = (n,)
    shapes |= {
        p + "ffn_gate_exps.weight": (n, f, e),
        p + "ffn_up_exps.weight": (n, f, e),
        p + "ffn_down_exps.weight": (n, e, f),
    }
    if c.n_expert_shared:
        fs = f * c.n_expert_shared
        shapes |= {
            p + "ffn_gate_shexp.weight": (fs, e),
            p + "ffn_up_shexp.weight": (fs, e),
            p + "ffn_down_shexp.weight": (e, fs),
        }
    return shapes

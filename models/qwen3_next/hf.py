"""Qwen3-Next Hugging Face checkpoints in GGUF's layout, as llama.cpp's converter writes
them: ``in_proj_qkvz`` (grouped per key head) split into ``attn_qkv`` (all Q, all K, all V)
and ``attn_gate`` (Z), ``A_log`` stored as ``ssm_a = -exp(A_log)``, the conv weight
squeezed to ``(C, K)``, the ``1 + w`` norms stored as ``1 + w`` (the gated norm of the
delta net is a plain scale and stays), and the experts stacked."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.names import TensorNames, stacked_experts_from_hf, tensors_from_hf
from tessera.models.qwen3_next.config import Qwen3NextConfig


def _plus_one(value: Any, config: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float32) + np.float32(1.0)


def _minus_exp(value: Any, config: Any) -> np.ndarray:
    return -np.exp(np.asarray(value, dtype=np.float32))


def _squeeze(value: Any, config: Any) -> np.ndarray:
    return np.asarray(value).reshape(np.shape(value)[0], -1)


HF_NAMES = TensorNames(
    global_names={
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
        "linear_attn.conv1d.weight": "ssm_conv1d.weight",
        "linear_attn.dt_bias": "ssm_dt.bias",
        "linear_attn.A_log": "ssm_a",
        "linear_attn.norm.weight": "ssm_norm.weight",
        "linear_attn.out_proj.weight": "ssm_out.weight",
        "mlp.gate.weight": "ffn_gate_inp.weight",
        "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
        "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    },
    checkpoint="a Qwen3-Next",
    plugin="qwen3next architecture",
    skip_prefixes=("mtp.", "model.mtp."),  # the MTP block: llama.cpp's converter can drop it
    transforms={
        "output_norm.weight": _plus_one,
        "attn_norm.weight": _plus_one,
        "post_attention_norm.weight": _plus_one,
        "attn_q_norm.weight": _plus_one,
        "attn_k_norm.weight": _plus_one,
        "ssm_a": _minus_exp,
        "ssm_conv1d.weight": _squeeze,
    },
)


def qwen3_next_tensors(
    c: Qwen3NextConfig, hf: Mapping[str, Any], for_gguf: bool
) -> Iterator[tuple[str, Any]]:
    """``(gguf_name, value)`` of every tensor of the checkpoint ``hf``."""
    plain, qkvz, experts = {}, {}, {}
    for name in hf:
        layer, _, rest = name.removeprefix("model.layers.").partition(".")
        if name.startswith("model.layers.") and rest == "linear_attn.in_proj_qkvz.weight":
            qkvz[int(layer)] = name
        elif name.startswith("model.layers.") and rest.startswith("mlp.experts."):
            experts.setdefault(int(layer), {})[rest] = name
        else:
            plain[name] = hf[name]
    skip = ("lm_head.weight",) if c.tied_embeddings else ()
    yield from tensors_from_hf(HF_NAMES, c, plain, for_gguf, skip=skip)
    for layer, name in sorted(qkvz.items()):
        yield from split_qkvz(c, layer, np.asarray(hf[name]))
    for layer, names in sorted(experts.items()):
        yield from stacked_experts_from_hf(c, layer, names, hf, "Qwen3-Next")


def split_qkvz(c: Qwen3NextConfig, layer: int, w: np.ndarray) -> Iterator[tuple[str, Any]]:
    """HF's rows, per key head ``[q, k, v, z]``, as llama.cpp stores them: ``attn_qkv``
    (every head's q, then every k, then every v) and ``attn_gate`` (every z)."""
    r = c.n_v_heads // c.n_k_heads
    sizes = [c.k_head_dim, c.k_head_dim, r * c.v_head_dim, r * c.v_head_dim]
    grouped = w.reshape(c.n_k_heads, sum(sizes), w.shape[-1])
    q, k, v, z = np.split(grouped, np.cumsum(sizes)[:-1], axis=1)
    flat = [part.reshape(-1, w.shape[-1]) for part in (q, k, v, z)]
    yield f"blk.{layer}.attn_qkv.weight", np.concatenate(flat[:3])
    yield f"blk.{layer}.attn_gate.weight", flat[3]

"""DeepSeek-V2/V3 Hugging Face checkpoints read as llama.cpp's converter reads them: the
config (YaRN, the router's rules) and the tensors HF stores otherwise than GGUF
(``kv_b_proj``, the experts one by one)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.names import HF_EXPERT_NAMES, fields_from_hf, stacked_experts_from_hf
from tessera.errors import ModelFileError
from tessera.models.deepseek2.config import CONFIG_FIELDS, DeepSeek2Config


#: HF's per-expert projections -> GGUF's stacked tensors.
def config_from_hf(hf: Mapping[str, Any]) -> DeepSeek2Config:
    """The config of a ``deepseek_v2`` / ``deepseek_v3`` ``config.json``.

    transformers routes V3 by a biased sigmoid and V2 by softmax whatever the file says;
    a ``scoring_func`` the file states wins, as in llama.cpp's converter.
    """
    v3 = hf["model_type"] == "deepseek_v3"
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    return DeepSeek2Config(
        **fields_from_hf(CONFIG_FIELDS, hf),
        rope_freq_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        **_yarn_from_hf(rope),
        gating=str(hf.get("scoring_func") or ("sigmoid" if v3 else "softmax")),
        expert_bias=v3,
    )


def _yarn_from_hf(rope: Mapping[str, Any]) -> dict[str, Any]:
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return {}
    mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if kind != "yarn":
        raise ModelFileError(
            f"this DeepSeek checkpoint scales RoPE with '{kind}'; llama.cpp's deepseek2 (and "
            "tessera) runs YaRN or no scaling"
        )
    if rope.get("attention_factor") is not None or not all_dim or (mscale and mscale != all_dim):
        raise ModelFileError(
            "this DeepSeek checkpoint's YaRN sets attention_factor, or an mscale other than "
            "mscale_all_dim, or no mscale_all_dim; llama.cpp's deepseek2 (and tessera) scales "
            "as DeepSeek's own configs do (mscale = mscale_all_dim)"
        )
    return {
        "rope_freq_scale": 1.0 / float(rope["factor"]),
        "n_ctx_orig": int(rope["original_max_position_embeddings"]),
        "yarn_beta_fast": float(rope.get("beta_fast") or 32.0),
        "yarn_beta_slow": float(rope.get("beta_slow") or 1.0),
        "mscale_all_dim": float(all_dim),
    }


def split_kv_b(c: DeepSeek2Config, layer: int, kv_b: np.ndarray) -> Iterator[tuple[str, Any]]:
    """``kv_b_proj`` ``(H (nope + v), kv_lora)`` as llama.cpp's converter splits it:
    ``attn_k_b`` ``(H, kv_lora, nope)`` (each head's no-RoPE key rows, transposed) and
    ``attn_v_b`` ``(H, v, kv_lora)``."""
    per_head = kv_b.reshape(c.n_head, c.qk_nope_dim + c.v_head_dim, c.kv_lora_rank)
    p = f"blk.{layer}."
    yield p + "attn_k_b.weight", np.ascontiguousarray(per_head[:, : c.qk_nope_dim].swapaxes(1, 2))
    yield p + "attn_v_b.weight", np.ascontiguousarray(per_head[:, c.qk_nope_dim :])


def experts_from_hf(
    c: DeepSeek2Config, layer: int, names: Mapping[str, str], hf: Mapping[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """GGUF's stacked expert tensors of ``layer`` from HF's per-expert ones (``names``:
    ``mlp.experts.E.{proj}.weight`` -> the checkpoint's name)."""
    yield from stacked_experts_from_hf(c, layer, names, hf, "DeepSeek")
    known = {
        f"mlp.experts.{e}.{proj}.weight" for e in range(c.n_expert) for proj in HF_EXPERT_NAMES
    }
    unknown = sorted(set(names) - known)
    if unknown:
        raise ModelFileError(
            f"unexpected tensor '{names[unknown[0]]}' in a DeepSeek checkpoint; the deepseek2 "
            "architecture plugin does not know where it goes"
        )

"""The DeepSeek-V2/V3 test models: random-weight checkpoints that ``transformers`` makes from
``DeepseekV2Config`` / ``DeepseekV3Config`` (tiny dims, float32), committed under
``tests/data/arch/<name>/`` with the GGUF llama.cpp's converter wrote from each
(``tests/data/arch/make_fixtures_llama_like.py`` makes both, from these specs and the
llama-like ones). They are :class:`llama_like.Fixture` specs, read by the same helpers.

Both have MLA attention over a 32-wide latent (16 no-RoPE + 8 RoPE values per query head,
values of 16) and YaRN as DeepSeek sets it (``mscale`` = ``mscale_all_dim``), one dense
block then two MoE blocks, in V2-Lite's and V3's shapes:

- ``deepseek-v2-lite``: the query projected directly (no ``q_lora_rank``), softmax over 4
  experts, top-2 as they are (no renormalization), two shared experts;
- ``deepseek-v3``: the query through a rank-24 LoRA, a sigmoid router with its selection
  bias over 8 experts in 4 groups (the best 2 eligible), top-3 renormalized and scaled by
  2.5, one shared expert.
"""

from __future__ import annotations

from llama_like import Fixture

#: The MLA and MoE dims both share (HF config fields).
MLA = {
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "head_dim": 8, "num_key_value_heads": 4, "moe_intermediate_size": 32,
    "first_k_dense_replace": 1, "max_position_embeddings": 64,
}  # fmt: skip
DIMS = {"n_embd": 64, "n_head": 4, "n_head_kv": 4, "n_ff": 96, "n_layer": 3}


def yarn(mscale: float) -> dict:
    return {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": mscale, "mscale_all_dim": mscale,
    }  # fmt: skip


FIXTURES = {
    f.name: f
    for f in (
        Fixture(
            "deepseek-v2-lite", "deepseek_v2", "deepseek2", "deepseek-ai-DeepSeek-V3.1", 31,
            DIMS,
            MLA | {
                "q_lora_rank": None, "n_routed_experts": 4, "num_experts_per_tok": 2,
                "n_shared_experts": 2, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                "norm_topk_prob": False, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
                "rope_parameters": yarn(0.707),
            },
        ),
        Fixture(
            "deepseek-v3", "deepseek_v3", "deepseek2", "deepseek-ai-DeepSeek-V3.1", 32, DIMS,
            MLA | {
                "q_lora_rank": 24, "n_routed_experts": 8, "num_experts_per_tok": 3,
                "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                "rope_parameters": yarn(1.0),
            },
        ),
    )
}  # fmt: skip

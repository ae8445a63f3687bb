"""GLM-4.5 (HF ``glm4_moe``, GGUF ``glm4moe``): a llama-family block with Q/K/V biases,
an optional Q/K norm per head (``use_qk_norm``) and NeoX RoPE over half of each head,
whose FFN is DeepSeek-style experts: a sigmoid router with a selection bias
(``e_score_correction_bias``, GGUF ``exp_probs_b``), optional expert groups, the top-k
renormalized (``norm_topk_prob``) and scaled (``routed_scaling_factor``), plus
``n_shared_experts`` ungated shared experts; the first ``first_k_dense_replace`` blocks
have a dense FFN. llama.cpp names the norm before the FFN ``post_attention_norm``.

The checkpoints carry ``num_nextn_predict_layers`` multi-token-prediction blocks after
the main ones (``model.layers.{n}.eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head.norm``
around a full MoE block); llama.cpp keeps them as ``blk.{n}.nextn.*`` and counts them in
``block_count``. The main pass never runs them; ``--spec-type mtp`` drafts with the first
(:mod:`tessera.plugins.spec.mtp`), fed the target's hidden state after ``output_norm``
as llama.cpp feeds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.hookspecs import hookimpl
from tessera.models.llama.glm4 import partial_rotary_dims
from tessera.models.llama.moe import MoEArchitecture
from tessera.models.llama.moe_config import MoEConfig
from tessera.models.llama.moe_hf import HF_NAMES as MOE_HF_NAMES

TESSERA_PLUGIN_API = 2

#: The MoE names plus GLM-4.5's router bias, shared experts, FFN norm and MTP tensors.
GLM4_MOE_HF_NAMES = attrs.evolve(
    MOE_HF_NAMES,
    layer_names={
        **MOE_HF_NAMES.layer_names,
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
        "eh_proj.weight": "nextn.eh_proj.weight",
        "enorm.weight": "nextn.enorm.weight",
        "hnorm.weight": "nextn.hnorm.weight",
        "shared_head.norm.weight": "nextn.shared_head_norm.weight",
        "embed_tokens.weight": "nextn.embed_tokens.weight",
        "shared_head.head.weight": "nextn.shared_head_head.weight",
    },
)
#: What llama.cpp's converter writes for every GLM-4.5 file, whatever the value.
ALWAYS_WRITTEN = {
    "leading_dense_block_count": "n_dense_lead",
    "expert_weights_scale": "expert_weights_scale",
    "expert_group_count": "n_group",
    "expert_group_used_count": "n_group_used",
    "expert_weights_norm": "norm_topk_prob",
}


class Glm4MoEArchitecture(MoEArchitecture):
    names = ("glm4moe",)
    hf_model_types = ("glm4_moe",)
    hf_names = GLM4_MOE_HF_NAMES

    def variant(self, config: MoEConfig) -> MoEArchitecture:
        return self

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> MoEConfig:
        c = super().config_from_gguf(metadata, tensor_shapes)
        n_shared = int(metadata.get("glm4moe.expert_shared_count", 0))
        # a file may state MTP blocks whose tensors it left out (llama.cpp's "trunk only")
        has_nextn = f"blk.{c.n_layer}.nextn.eh_proj.weight" in tensor_shapes
        return attrs.evolve(
            c,
            n_ff_shexp=c.n_ff_exp * n_shared,
            shexp_gated=False,
            qk_norm="blk.0.attn_q_norm.weight" in tensor_shapes,
            n_nextn=c.n_nextn if has_nextn else 0,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> MoEConfig:
        c = super().config_from_hf(hf)
        return attrs.evolve(
            c,
            n_ff_shexp=c.n_ff_exp * int(hf.get("n_shared_experts") or 0),
            shexp_gated=False,
            gating="sigmoid",
            expert_bias=True,
        )

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        n_nextn = int(hf.get("num_nextn_predict_layers") or 0)
        if "_checkpoint_layers" in hf:  # only the MTP blocks the weights hold
            n_nextn = min(n_nextn, max(0, hf["_checkpoint_layers"] - fields["n_layer"]))
        return {
            "n_rot": partial_rotary_dims(hf, fields["head_dim"]),
            "qk_norm": bool(hf.get("use_qk_norm", False)),
            "n_nextn": n_nextn,
        }

    def gguf_metadata(self, c: MoEConfig) -> dict[str, Any]:
        meta = super().gguf_metadata(c)
        meta.pop("glm4moe.expert_shared_feed_forward_length", None)  # GGUF: a count
        meta["glm4moe.expert_shared_count"] = c.n_ff_shexp // c.n_ff_exp
        meta |= {f"glm4moe.{key}": getattr(c, name) for key, name in ALWAYS_WRITTEN.items()}
        return meta

    def example_config(self, **overrides: Any) -> MoEConfig:
        n_embd, n_head = overrides.get("n_embd", 64), overrides.get("n_head", 4)
        # every part GLM-4.5 can have: a dense first block, Q/K norms, two expert groups,
        # a shared expert and an MTP block
        glm = {
            "n_rot": n_embd // n_head // 2,
            "attn_bias": True,
            "qk_norm": True,
            "n_layer": 3,
            "n_nextn": 1,
            "n_dense_lead": 1,
            "n_ff_shexp": 32,
            "shexp_gated": False,
            "gating": "sigmoid",
            "expert_bias": True,
            "expert_weights_scale": 2.5,
            "norm_topk_prob": True,
            "n_group": 2,
            "n_group_used": 1,
        }
        return super().example_config(**(glm | overrides | {"arch": "glm4moe"}))


@hookimpl
def tessera_register_architectures(register):
    register(Glm4MoEArchitecture())

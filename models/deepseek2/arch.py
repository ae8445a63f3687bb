"""The ``deepseek2`` architecture: DeepSeek-V2 (V2-Lite's shape: a query without LoRA)
and DeepSeek-V3, from GGUF files as llama.cpp writes them and from HF folders
(``deepseek_v2``, ``deepseek_v3``).

What llama.cpp does, tessera does: HF's ``kv_b_proj`` is stored split per head into
``attn_k_b`` (transposed) and ``attn_v_b``, the KV cache holds the compressed latent and
the RoPE key part (one row of ``kv_lora_rank + n_rot`` values per token and layer, V
read from it: :class:`tessera.contract.arch.KVLayerLayout` ``v_in_k``), YaRN's scale
follows DeepSeek's ``mscale_all_dim`` (:mod:`tessera.models.deepseek2.mla`), expert groups
are scored by their two best experts, and the MTP layers of a V3 checkpoint are left
out (as llama.cpp's converter leaves them). The config and names are in
:mod:`tessera.models.deepseek2.config`, the forward pass in
:mod:`tessera.models.deepseek2.graph`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import Architecture, KVLayerLayout, metadata_key
from tessera.contract.experts import ExpertLayout, ExpertTensors, ModelExperts, checked_experts
from tessera.contract.names import fields_from_gguf, fields_to_gguf, tensors_from_hf
from tessera.contract.routing import GATING_IDS
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.deepseek2.config import CONFIG_FIELDS, HF_NAMES, DeepSeek2Config
from tessera.models.deepseek2.graph import DeepSeek2Graph
from tessera.models.deepseek2.hf import config_from_hf, experts_from_hf, split_kv_b
from tessera.models.deepseek2.shapes import tensor_shapes

TESSERA_PLUGIN_API = 2
ARCH = "deepseek2"
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


class DeepSeek2Architecture(Architecture):
    names = (ARCH,)
    hf_model_types = ("deepseek_v2", "deepseek_v3")
    hf_classes = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> DeepSeek2Config:
        fields = fields_from_gguf(CONFIG_FIELDS, metadata, ARCH)
        n_vocab = fields["n_vocab"] or tensor_shapes["token_embd.weight"][0]
        key_mla = int(metadata_key(metadata, ARCH, "attention.key_length_mla"))
        kind = str(metadata.get(f"{ARCH}.rope.scaling.type", "none"))
        factor = float(metadata.get(f"{ARCH}.rope.scaling.factor") or 0.0)
        return DeepSeek2Config(
            **fields
            | {
                "n_vocab": int(n_vocab),
                "n_layer": fields["n_layer"] - fields["n_nextn"],
                "qk_nope_dim": key_mla - fields["n_rot"],
            },
            rope_freq_base=float(metadata.get(f"{ARCH}.rope.freq_base", 10000.0)),
            **_yarn_from_gguf(metadata, kind, factor),
            gating=GATING_IDS.get(int(metadata.get(f"{ARCH}.expert_gating_func", 0)), "softmax"),
            expert_bias=any(n.endswith("exp_probs_b.bias") for n in tensor_shapes),
            tied_embeddings="output.weight" not in tensor_shapes,
        )

    def config_from_hf(self, hf_config: Mapping[str, Any]) -> DeepSeek2Config:
        return config_from_hf(hf_config)

    def gguf_metadata(self, c: DeepSeek2Config) -> dict[str, Any]:
        a = ARCH
        meta = {"general.architecture": a, **fields_to_gguf(CONFIG_FIELDS, c, a)}
        meta |= {
            f"{a}.block_count": c.n_layer + c.n_nextn,
            # attention as llama.cpp runs it: MQA over the cached latent and RoPE key part
            f"{a}.attention.head_count_kv": 1,
            f"{a}.attention.key_length": c.kv_lora_rank + c.n_rot,
            f"{a}.attention.value_length": c.kv_lora_rank,
            f"{a}.attention.key_length_mla": c.head_dim_k,
            f"{a}.rope.freq_base": c.rope_freq_base,
            f"{a}.expert_gating_func": next(k for k, g in GATING_IDS.items() if g == c.gating),
        }
        if c.rope_freq_scale != 1.0:
            p = f"{a}.rope.scaling."
            meta |= {
                p + "type": "yarn",
                p + "factor": 1.0 / c.rope_freq_scale,
                p + "original_context_length": c.n_ctx_orig,
                p + "yarn_beta_fast": c.yarn_beta_fast,
                p + "yarn_beta_slow": c.yarn_beta_slow,
                # llama.cpp's converter stores a tenth of it (and its loader undoes that)
                p + "yarn_log_multiplier": 0.1 * c.mscale_all_dim,
            }
        if c.rope_attn_factor != 1.0:
            meta[f"{a}.rope.scaling.attn_factor"] = c.rope_attn_factor
        return meta

    def tensor_shapes(self, c: DeepSeek2Config) -> dict[str, tuple[int, ...]]:
        return tensor_shapes(c)

    def tensors_from_hf(
        self, c: DeepSeek2Config, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        skip = ("lm_head.weight",) if c.tied_embeddings else ()
        plain, kv_b, experts = {}, {}, {}
        for name in hf_tensors:
            layer, _, rest = name.removeprefix("model.layers.").partition(".")
            if not name.startswith("model.layers."):
                plain[name] = hf_tensors[name]
            elif int(layer) >= c.n_layer:
                continue  # V3's MTP layers: llama.cpp's converter drops them too
            elif rest == "self_attn.kv_b_proj.weight":
                kv_b[int(layer)] = name
            elif rest.startswith("mlp.experts."):
                experts.setdefault(int(layer), {})[rest] = name
            else:
                plain[name] = hf_tensors[name]
        yield from tensors_from_hf(HF_NAMES, c, plain, for_gguf, skip=skip)
        for layer, name in sorted(kv_b.items()):
            yield from split_kv_b(c, layer, np.asarray(hf_tensors[name]))
        for layer, names in sorted(experts.items()):
            yield from experts_from_hf(c, layer, names, hf_tensors)

    def example_config(self, **overrides: Any) -> DeepSeek2Config:
        # V3's parts: a query LoRA, a dense first block, a biased sigmoid router over four
        # groups of two, a shared expert and YaRN (the kit's prompt is past its 8 positions)
        fields = {
            "n_vocab": 256, "n_embd": 64, "n_layer": 3, "n_ff": 96, "n_head": 4,
            "q_lora_rank": 24, "kv_lora_rank": 32, "qk_nope_dim": 16, "n_rot": 8,
            "v_head_dim": 16, "n_dense_lead": 1, "n_expert": 8, "n_expert_used": 2,
            "n_ff_exp": 32, "n_expert_shared": 1, "gating": "sigmoid", "expert_bias": True,
            "norm_topk_prob": True, "expert_weights_scale": 2.5, "n_group": 4,
            "n_group_used": 2, "rope_freq_scale": 0.25, "n_ctx_orig": 8, "mscale_all_dim": 1.0,
        }  # fmt: skip
        unused = ("arch", "n_head_kv", "head_dim")  # the kit's generic sizes MLA has not
        return DeepSeek2Config(**fields | {k: v for k, v in overrides.items() if k not in unused})

    def required_ops(self, c: DeepSeek2Config) -> list[tuple[str, dict[str, Any]]]:
        rot = {"n_rot": c.n_rot, "head_dim": c.n_rot, "neox": False}
        k_dim = c.kv_lora_rank + c.n_rot
        ops = [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", rot),
            ("attention", {"n_head": c.n_head, "n_head_kv": 1, "head_dim": k_dim}),
            ("set_rows", {}),
            ("swiglu", {}),
            ("concat", {}),
            ("matmul_heads", {"n_head": c.n_head}),
        ]
        if c.rope_freq_scale != 1.0 or c.rope_attn_factor != 1.0:
            ops.append(("rope_ext", rot))
        return ops

    def kv_layout(self, c: DeepSeek2Config) -> list[KVLayerLayout | None]:
        row = KVLayerLayout(1, c.kv_lora_rank + c.n_rot, c.kv_lora_rank, v_in_k=True)
        return [row] * c.n_layer

    def expert_layout(self, c: DeepSeek2Config) -> ExpertLayout:
        return ExpertLayout(
            c.n_expert,
            c.n_expert_used,
            tuple(
                ExpertTensors(il, *(f"blk.{il}.{n}.weight" for n in _EXPERTS))
                for il in range(c.n_layer)
                if c.is_moe_layer(il)
            ),
        )

    def build(
        self,
        c: DeepSeek2Config,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts | None = None,
    ) -> DeepSeek2Graph:
        """``experts`` comes from the loader; without it the stacked tensors in ``weights``
        are used as they are (every expert resident)."""
        experts = checked_experts(
            ARCH, self.expert_layout(c), self.tensor_shapes(c), weights, experts
        )
        return DeepSeek2Graph(c, weights, backend, experts)


def _yarn_from_gguf(metadata: Mapping[str, Any], kind: str, factor: float) -> dict[str, Any]:
    """The YaRN fields of a GGUF file (``none``: none), as llama.cpp's loader reads them."""
    p = f"{ARCH}.rope.scaling."
    fields = {"rope_attn_factor": float(metadata.get(p + "attn_factor", 1.0))}
    if kind == "none" or not factor:
        return fields
    if kind != "yarn":
        raise ModelFileError(
            f"this deepseek2 file scales RoPE with '{kind}'; llama.cpp's deepseek2 (and "
            "tessera) runs YaRN or no scaling"
        )
    return fields | {
        "rope_freq_scale": 1.0 / factor,
        "n_ctx_orig": int(metadata.get(p + "original_context_length", 0)),
        "yarn_beta_fast": float(metadata.get(p + "yarn_beta_fast", 32.0)),
        "yarn_beta_slow": float(metadata.get(p + "yarn_beta_slow", 1.0)),
        # the converter stores a tenth of mscale_all_dim; llama.cpp divides it out again
        "mscale_all_dim": float(metadata.get(p + "yarn_log_multiplier", 0.0)) / 0.1,
    }


@hookimpl
def tessera_register_architectures(register):
    register(DeepSeek2Architecture())

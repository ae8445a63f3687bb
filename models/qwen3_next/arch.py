"""The ``qwen3next`` architecture: Qwen3-Next, from GGUF files as llama.cpp writes them and
from HF folders (``qwen3_next``).

A hybrid: most layers are gated delta nets (linear attention with a recurrent state per
sequence, :mod:`tessera.models.qwen3_next.delta_net`), every few a gated full attention
over the KV cache; every FFN is a mixture of experts with a gated shared expert. The KV
cache holds rows for the attention layers only; the delta nets' conv and memory states are
declared by :meth:`Qwen3NextArchitecture.recurrent_layout` and kept by the context
(:mod:`tessera.engine.recurrent`). The MTP block of published checkpoints is not loaded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tessera.contract.arch import (
    Architecture,
    KVLayerLayout,
    RecurrentLayerLayout,
)
from tessera.contract.experts import ExpertLayout, ExpertTensors, ModelExperts, checked_experts
from tessera.contract.names import fields_from_gguf, fields_from_hf, fields_to_gguf
from tessera.hookspecs import hookimpl
from tessera.models.qwen3_next import config as cfg
from tessera.models.qwen3_next.config import ARCH, CONFIG_FIELDS, Qwen3NextConfig
from tessera.models.qwen3_next.delta_net import STACKED_DECODE
from tessera.models.qwen3_next.graph import Qwen3NextGraph
from tessera.models.qwen3_next.hf import qwen3_next_tensors
from tessera.models.qwen3_next.rope import rope_scaling_to_gguf
from tessera.models.qwen3_next.shapes import tensor_shapes

TESSERA_PLUGIN_API = 2
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


class Qwen3NextArchitecture(Architecture):
    names = (ARCH,)
    hf_model_types = ("qwen3_next",)
    hf_classes = ("Qwen3NextForCausalLM",)

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> Qwen3NextConfig:
        fields = fields_from_gguf(CONFIG_FIELDS, metadata, ARCH)
        return cfg.config_from_gguf(fields, metadata, tensor_shapes)

    def config_from_hf(self, hf_config: Mapping[str, Any]) -> Qwen3NextConfig:
        return cfg.config_from_hf(fields_from_hf(CONFIG_FIELDS, hf_config), hf_config)

    def gguf_metadata(self, c: Qwen3NextConfig) -> dict[str, Any]:
        a = ARCH
        meta = {"general.architecture": a, **fields_to_gguf(CONFIG_FIELDS, c, a)}
        meta |= {
            f"{a}.rope.freq_base": c.rope_freq_base,
            f"{a}.rope.dimension_count": c.n_rot,
            f"{a}.ssm.inner_size": c.value_dim,
            f"{a}.attention.recurrent_layers": list(c.recurrent),
        }
        meta |= rope_scaling_to_gguf(c.rope_scaling, a)
        if not c.norm_topk_prob:  # llama.cpp always renormalizes; say when not
            meta[f"{a}.expert_weights_norm"] = False
        return meta

    def tensor_shapes(self, c: Qwen3NextConfig) -> dict[str, tuple[int, ...]]:
        return tensor_shapes(c)

    def tensors_from_hf(
        self, c: Qwen3NextConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        return qwen3_next_tensors(c, hf_tensors, for_gguf)

    def example_config(self, **overrides: Any) -> Qwen3NextConfig:
        fields = {
            "n_vocab": 256, "n_embd": 64, "n_layer": 4, "n_ff": 64, "n_head": 4,
            "n_head_kv": 2, "head_dim": 16, "n_rot": 4,
            "recurrent": (True, False, True, False), "conv_kernel": 4, "n_k_heads": 2,
            "k_head_dim": 16, "n_v_heads": 4, "v_head_dim": 16, "n_expert": 4,
            "n_expert_used": 2, "n_ff_exp": 32, "n_ff_shexp": 48,
        }  # fmt: skip
        fields |= {k: v for k, v in overrides.items() if k != "arch"}
        if "recurrent" not in overrides:  # attention every second layer
            fields["recurrent"] = tuple(il % 2 == 0 for il in range(fields["n_layer"]))
        return Qwen3NextConfig(**fields)

    def required_ops(self, c: Qwen3NextConfig) -> list[tuple[str, dict[str, Any]]]:
        rot = {"n_rot": c.n_rot, "head_dim": c.head_dim, "neox": True}
        yarn = [("rope_ext", rot)] if c.rope_scaling.kind == "yarn" else []
        return yarn + [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("scale", {}),
            ("silu", {}),
            ("swiglu", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", rot),
            ("attention", {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}),
            ("set_rows", {}),
            ("sigmoid", {}),
            ("ssm_conv", {"n_channels": c.conv_dim, "kernel": c.conv_kernel}),
            ("gated_delta_net", {"n_k_heads": c.n_k_heads, "n_v_heads": c.n_v_heads}),
        ]

    def kv_layout(self, c: Qwen3NextConfig) -> list[KVLayerLayout | None]:
        row = KVLayerLayout(c.n_head_kv, c.head_dim, c.head_dim)
        return [None if recurrent else row for recurrent in c.recurrent]

    def recurrent_layout(self, c: Qwen3NextConfig) -> list[RecurrentLayerLayout | None]:
        state = RecurrentLayerLayout(
            (c.conv_kernel - 1, c.conv_dim), (c.n_v_heads, c.k_head_dim, c.v_head_dim)
        )
        return [state if recurrent else None for recurrent in c.recurrent]

    def expert_layout(self, c: Qwen3NextConfig) -> ExpertLayout:
        return ExpertLayout(
            c.n_expert,
            c.n_expert_used,
            tuple(
                ExpertTensors(il, *(f"blk.{il}.{n}.weight" for n in _EXPERTS))
                for il in range(c.n_layer)
            ),
        )

    def build(
        self,
        c: Qwen3NextConfig,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts | None = None,
    ) -> Qwen3NextGraph:
        """``experts`` comes from the loader; without it the stacked tensors in ``weights``
        are used as they are (every expert resident)."""
        experts = checked_experts(
            ARCH, self.expert_layout(c), self.tensor_shapes(c), weights, experts
        )
        return Qwen3NextGraph(c, weights, backend, experts)


@hookimpl
def tessera_register_architectures(register):
    register(Qwen3NextArchitecture())


@hookimpl
def tessera_register_switches(register):
    register(STACKED_DECODE)

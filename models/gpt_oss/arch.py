"""The ``gpt-oss`` architecture: OpenAI's gpt-oss-20b and gpt-oss-120b (GGUF
``general.architecture = gpt-oss``, HF ``GptOssForCausalLM``), as llama.cpp runs them.

The config and its keys are in :mod:`tessera.models.gpt_oss.config`, the checkpoint layout
in :mod:`tessera.models.gpt_oss.hf_tensors`, the forward pass in
:mod:`tessera.models.gpt_oss.graph`. The experts are declared through ``expert_layout``, so
the loader places them (resident, offloaded, cached) and loads each MXFP4 expert as a 2-D
MXFP4 weight (the backend's kernel, or dequantized); their biases are ordinary weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import Architecture, KVLayerLayout
from tessera.contract.experts import ExpertLayout, ExpertTensors, ModelExperts, checked_experts
from tessera.contract.names import (
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
)
from tessera.hookspecs import hookimpl
from tessera.models.gpt_oss.config import (
    ARCH,
    CONFIG_FIELDS,
    GptOssConfig,
    Yarn,
    swa_layers_from_gguf,
    swa_layers_from_hf,
    swa_layers_to_gguf,
    swa_pattern,
    yarn_from_gguf,
    yarn_from_hf,
    yarn_to_gguf,
)
from tessera.models.gpt_oss.graph import GptOssGraph
from tessera.models.gpt_oss.hf_tensors import gpt_oss_tensors

TESSERA_PLUGIN_API = 2
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


class GptOssArchitecture(Architecture):
    names = (ARCH,)
    hf_model_types = ("gpt_oss",)
    hf_classes = ("GptOssForCausalLM",)

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> GptOssConfig:
        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, ARCH))
        base = fields["rope_freq_base"]
        return GptOssConfig(
            **fields,
            n_vocab=int(tensor_shapes["token_embd.weight"][0]),
            swa_layers=swa_layers_from_gguf(metadata, fields["n_layer"]),
            rope_freq_base_swa=float(metadata.get(f"{ARCH}.rope.freq_base_swa", base)),
            yarn=yarn_from_gguf(metadata, fields["n_ctx_train"]),
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> GptOssConfig:
        fields = default_head_dims(fields_from_hf(CONFIG_FIELDS, hf))
        rope = hf.get("rope_parameters") or {}
        base = float(rope.get("rope_theta", hf.get("rope_theta", 150000.0)))
        return GptOssConfig(
            **fields,
            swa_layers=swa_layers_from_hf(hf),
            rope_freq_base=base,
            yarn=yarn_from_hf(hf),
        )

    def gguf_metadata(self, c: GptOssConfig) -> dict[str, Any]:
        meta = {"general.architecture": ARCH, **fields_to_gguf(CONFIG_FIELDS, c, ARCH)}
        if c.rope_freq_base_swa != c.rope_freq_base:
            meta[f"{ARCH}.rope.freq_base_swa"] = c.rope_freq_base_swa
        return meta | swa_layers_to_gguf(c) | yarn_to_gguf(c.yarn)

    def tensor_shapes(self, c: GptOssConfig) -> dict[str, tuple[int, ...]]:
        q_dim, kv_dim, d = c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_embd
        e, f = c.n_expert, c.n_ff_exp
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, d)}
        for il in range(c.n_layer):
            p = f"blk.{il}."
            shapes |= {
                p + "attn_norm.weight": (d,),
                p + "attn_q.weight": (q_dim, d),
                p + "attn_q.bias": (q_dim,),
                p + "attn_k.weight": (kv_dim, d),
                p + "attn_k.bias": (kv_dim,),
                p + "attn_v.weight": (kv_dim, d),
                p + "attn_v.bias": (kv_dim,),
                p + "attn_output.weight": (d, q_dim),
                p + "attn_output.bias": (d,),
                p + "attn_sinks.weight": (c.n_head,),
                p + "post_attention_norm.weight": (d,),
                p + "ffn_gate_inp.weight": (e, d),
                p + "ffn_gate_inp.bias": (e,),
                p + "ffn_gate_exps.weight": (e, f, d),
                p + "ffn_gate_exps.bias": (e, f),
                p + "ffn_up_exps.weight": (e, f, d),
                p + "ffn_up_exps.bias": (e, f),
                p + "ffn_down_exps.weight": (e, d, f),
                p + "ffn_down_exps.bias": (e, d),
            }
        shapes["output_norm.weight"] = (d,)
        shapes["output.weight"] = (c.n_vocab, d)
        return shapes

    def tensors_from_hf(
        self, c: GptOssConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        yield from gpt_oss_tensors(hf_tensors, for_gguf)

    def example_config(self, **overrides: Any) -> GptOssConfig:
        overrides.pop("arch", None)
        n_ff = overrides.pop("n_ff", 64)
        n_layer = overrides.get("n_layer", 2)
        fields = {
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": n_layer,
            "n_head": 4,
            "n_head_kv": 2,
            "n_expert": 6,
            "n_expert_used": 4,
            "n_ff_exp": n_ff,
            # a sliding layer, then a full one; a window shorter than the kit's prompt
            "n_swa": 4,
            "swa_layers": swa_pattern(n_layer),
            "yarn": Yarn(factor=32.0, n_ctx_orig=4096),
        } | overrides
        fields.setdefault("head_dim", fields["n_embd"] // fields["n_head"])
        return GptOssConfig(**fields)

    def example_tensors(self, c: GptOssConfig) -> dict[str, np.ndarray]:
        # sinks of the scores' order, so they take a real share of each softmax
        rng = np.random.default_rng(c.n_layer)
        return {
            f"blk.{il}.attn_sinks.weight": rng.normal(0.0, 1.0, c.n_head).astype(np.float32)
            for il in range(c.n_layer)
        }

    def required_ops(self, c: GptOssConfig) -> list[tuple[str, dict[str, Any]]]:
        rot = {"n_rot": c.head_dim, "head_dim": c.head_dim, "neox": True}
        heads = {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}
        ops: list[tuple[str, dict[str, Any]]] = [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", rot),
            ("attention_softcap", heads | {"sinks": True}),
            ("set_rows", {}),
            ("swiglu_oai", {"alpha": c.swiglu_alpha, "limit": c.swiglu_limit}),
        ]
        if c.yarn is not None:
            ops.append(("rope_ext", rot))
        return ops

    def kv_layout(self, c: GptOssConfig) -> list[KVLayerLayout | None]:
        return [KVLayerLayout(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer

    def expert_layout(self, c: GptOssConfig) -> ExpertLayout:
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
        c: GptOssConfig,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts | None = None,
    ) -> GptOssGraph:
        """``experts`` comes from the loader; without it the stacked tensors in ``weights``
        are used as they are (every expert resident)."""
        experts = checked_experts(
            ARCH, self.expert_layout(c), self.tensor_shapes(c), weights, experts
        )
        return GptOssGraph(c, weights, backend, experts)


@hookimpl
def tessera_register_architectures(register):
    register(GptOssArchitecture())

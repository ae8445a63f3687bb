"""The ``llama`` architecture family: Llama, Qwen2 and Qwen3 (GGUF and Hugging Face), and
the base of the family's other members (Mistral, SmolLM3, Granite, OLMo 2, Phi-3), which
register from their own modules.

One decoder: RMSNorm -> attention with GQA and RoPE -> residual -> RMSNorm -> SwiGLU FFN
-> residual. The members differ in facts this module reads from metadata: Qwen2 adds Q/K/V
biases, Qwen3 normalizes Q and K per head (QK-norm), and GGUF ``llama`` files store Q/K
rows permuted for GGML's normal-mode RoPE while NeoX-style archs and every HF folder use
unpermuted weights. What each GGUF name fixes is :data:`tessera.models.llama.config.TRAITS`;
the config, its GGUF keys and HF fields and the HF tensor names are declared in
:mod:`tessera.models.llama.config`, RoPE scaling in :mod:`tessera.models.llama.rope`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import Architecture, KVLayerLayout, check_tensors
from tessera.contract.names import (
    TensorNames,
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
    tensors_from_hf,
)
from tessera.hookspecs import hookimpl
from tessera.models.llama import rope
from tessera.models.llama.config import (
    CONFIG_FIELDS,
    HF_NAMES,
    TRAITS,
    LlamaConfig,
    block_traits,
    nope_layers,
)
from tessera.models.llama.graph import LlamaGraph
from tessera.models.llama.shapes import tensor_shapes

TESSERA_PLUGIN_API = 2


class LlamaArchitecture(Architecture):
    names: tuple[str, ...] = ("llama", "qwen2", "qwen3")
    hf_model_types: tuple[str, ...] = ("llama", "qwen2", "qwen3")
    #: The HF tensor names it maps (the MoE architectures extend them).
    hf_names: TensorNames = HF_NAMES
    #: HF ``model_type`` -> GGUF architecture, where they differ.
    gguf_arch: Mapping[str, str] = {}

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> LlamaConfig:
        arch = metadata["general.architecture"]
        if arch == "llama" and metadata.get("llama.expert_count"):  # Mixtral: routed experts
            return _moe_architecture().config_from_gguf(metadata, tensor_shapes)
        t = TRAITS[arch]
        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, arch))
        fields |= fields_from_gguf(t.fields, metadata, arch)
        n_vocab = (
            fields["n_vocab"]
            or tensor_shapes.get(
                "token_embd.weight", (len(metadata.get("tokenizer.ggml.tokens", [])),)
            )[0]
        )
        freq_scale, scaling = rope.rope_scaling_from_gguf(metadata, arch, tensor_shapes)
        # block_count counts the MTP (NextN) blocks stored after the main ones
        n_layer = fields["n_layer"] - fields["n_nextn"]
        return LlamaConfig(
            **fields
            | {
                "n_vocab": int(n_vocab),
                "n_layer": n_layer,
                "n_rot": fields["n_rot"] or fields["head_dim"],
            },
            arch=arch,
            rope_freq_scale=freq_scale,
            rope_scaling=scaling,
            rope_neox=t.rope_neox,
            attn_bias=t.attn_bias or "blk.0.attn_q.bias" in tensor_shapes,
            **block_traits(t),
            nope_layers=nope_layers(t.nope_step, n_layer),
            tied_embeddings="output.weight" not in tensor_shapes,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> LlamaConfig:
        arch = self.gguf_arch.get(hf["model_type"], hf["model_type"])
        t = TRAITS[arch]
        fields = default_head_dims(fields_from_hf(CONFIG_FIELDS, hf))
        fields |= fields_from_hf(t.fields, hf) | self.hf_fields(hf, fields)
        fields.setdefault("n_rot", fields["head_dim"])
        base = float(
            (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
        )
        freq_scale, scaling = rope.rope_scaling_from_hf(hf, fields["n_rot"], base)
        return LlamaConfig(
            **(block_traits(t) | fields),  # a member's config.json may say more (Q/K norms)
            arch=arch,
            rope_freq_base=base,
            rope_freq_scale=freq_scale,
            rope_scaling=scaling,
            # HF weights are unpermuted: NeoX pairs, unless transformers turns adjacent ones
            rope_neox=not t.hf_interleaved,
            attn_bias=t.attn_bias or bool(hf.get("attention_bias", False)),
        )

    def hf_fields(self, hf: Mapping[str, Any], fields: Mapping[str, Any]) -> dict[str, Any]:
        """A member's own ``config.json`` facts (sliding window, NoPE layers ...) as config
        fields; ``fields`` are those read so far. The default has none."""
        return {}

    def gguf_metadata(self, c: LlamaConfig) -> dict[str, Any]:
        a = c.arch
        meta = {"general.architecture": a, **fields_to_gguf(CONFIG_FIELDS, c, a)}
        meta |= fields_to_gguf(TRAITS[a].fields, c, a)
        meta[f"{a}.block_count"] = c.n_layer + c.n_nextn  # the MTP blocks follow the main ones
        meta |= rope.rope_scaling_to_gguf(c.rope_freq_scale, c.rope_scaling, a)
        return meta

    def tensor_shapes(self, c: LlamaConfig) -> dict[str, tuple[int, ...]]:
        return tensor_shapes(c)

    def tensors_from_hf(
        self, c: LlamaConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        skip = ("lm_head.weight",) if c.tied_embeddings else ()
        yield from tensors_from_hf(
            self.hf_names_of(c), c, hf_tensors, for_gguf, skip=skip, checkpoint=f"a {c.arch}"
        )
        yield from rope.factor_tensors(c.rope_scaling)

    def hf_names_of(self, c: LlamaConfig) -> TensorNames:
        """The HF tensor names of a config's checkpoint (a member may differ by config)."""
        return self.hf_names

    def example_config(self, **overrides: Any) -> LlamaConfig:
        arch = overrides.get("arch", self.names[0])
        t = TRAITS[arch]
        fields = {
            "arch": arch,
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_ff": 128,
            "n_head": 4,
            "n_head_kv": 2,
            "rms_eps": 1e-6 if arch != "llama" else 1e-5,
            "rope_neox": t.rope_neox,
            "attn_bias": t.attn_bias,
            **block_traits(t),
            "nope_layers": nope_layers(t.nope_step, overrides.get("n_layer", 2)),
        } | overrides
        fields.setdefault("head_dim", fields["n_embd"] // fields["n_head"])
        return LlamaConfig(**fields)

    def example_tensors(self, c: LlamaConfig) -> dict[str, np.ndarray]:
        # RoPE divisors are not free weights: a test model's stay between 1 and 4
        rng = np.random.default_rng(c.n_layer)
        shapes = rope.factor_shapes(c.rope_scaling, c.n_rot)
        return {n: rng.uniform(1.0, 4.0, s).astype(np.float32) for n, s in shapes.items()}

    def required_ops(self, c: LlamaConfig) -> list[tuple[str, dict[str, Any]]]:
        rot = {"n_rot": c.n_rot, "head_dim": c.head_dim, "neox": c.rope_neox}
        ops = [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", rot),
            ("attention", {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}),
            ("set_rows", {}),
            ("swiglu", {}),
        ]
        if rope.needs_rope_ext(c.rope_scaling):
            ops.append(("rope_ext", rot))
        scales = (c.embedding_scale, c.residual_scale, c.logit_scale)
        if any(s != 1.0 for s in scales):
            ops.append(("scale", {}))
        if c.attn_temp_scale:
            ops.append(("mul", {}))
        return ops

    def kv_layout(self, c: LlamaConfig) -> list[KVLayerLayout | None]:
        return [KVLayerLayout(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer

    def tensor_parallel(
        self, c: LlamaConfig, rank: int, world_size: int, *, split_lm_head: bool = True
    ) -> Any:
        """Megatron-style split over ``world_size`` ranks (see :mod:`tessera.models.llama.tp`)."""
        from tessera.models.llama.tp import LlamaTensorParallel

        return LlamaTensorParallel(c, rank, world_size, split_lm_head)

    def build(self, c: LlamaConfig, weights: Mapping[str, Any], backend: Any) -> LlamaGraph:
        check_tensors(c.arch, self.tensor_shapes(c), weights)
        return LlamaGraph(c, weights, backend)

    def variant(self, config: LlamaConfig) -> Architecture:
        """A config with routed experts (Mixtral) runs on the MoE architecture's code."""
        return _moe_architecture() if getattr(config, "n_expert", 0) else self


def _moe_architecture() -> Architecture:
    # The MoE plugin builds on this module, so it is imported when a file needs it.
    from tessera.models.llama.moe import MixtralArchitecture

    return MixtralArchitecture()


@hookimpl
def tessera_register_architectures(register):
    register(LlamaArchitecture())

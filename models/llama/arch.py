"""The ``llama`` architecture family: Llama, Qwen2 and Qwen3 (GGUF and Hugging Face).

One pre-norm decoder: RMSNorm -> attention with GQA and RoPE -> residual -> RMSNorm ->
SwiGLU FFN -> residual. The family members differ only in small facts this module reads
from metadata: Qwen2 adds Q/K/V biases, Qwen3 normalizes Q and K per head (QK-norm), and
GGUF ``llama`` files store Q/K rows permuted for GGML's normal-mode RoPE while every other
case uses NeoX-style RoPE on unpermuted weights. The config, its GGUF keys and HF fields and
the HF tensor names are declared in :mod:`tessera.models.llama.config`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tessera.contract.arch import (
    Architecture,
    KVLayerLayout,
    check_tensors,
    metadata_key,
)
from tessera.contract.names import (
    default_head_dims,
    fields_from_gguf,
    fields_from_hf,
    fields_to_gguf,
    tensors_from_hf,
)
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.llama.config import ARCHS, CONFIG_FIELDS, HF_NAMES, LlamaConfig
from tessera.models.llama.graph import LlamaGraph

TESSERA_PLUGIN_API = 2


class LlamaArchitecture(Architecture):
    names = ARCHS
    hf_model_types = ARCHS
    #: The HF tensor names it maps (the MoE architectures extend them).
    hf_names = HF_NAMES

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> LlamaConfig:
        arch = metadata["general.architecture"]
        if arch == "llama" and metadata.get("llama.expert_count"):  # Mixtral: routed experts
            return _moe_architecture().config_from_gguf(metadata, tensor_shapes)
        fields = default_head_dims(fields_from_gguf(CONFIG_FIELDS, metadata, arch))
        n_vocab = (
            fields["n_vocab"]
            or tensor_shapes.get(
                "token_embd.weight", (len(metadata.get("tokenizer.ggml.tokens", [])),)
            )[0]
        )
        scale = 1.0
        if metadata.get(f"{arch}.rope.scaling.type", "none") == "linear":
            scale = 1.0 / float(metadata_key(metadata, arch, "rope.scaling.factor"))
        # block_count counts the MTP (NextN) blocks stored after the main ones
        n_layer = fields["n_layer"] - fields["n_nextn"]
        return LlamaConfig(
            **fields | {"n_vocab": int(n_vocab), "n_layer": n_layer},
            arch=arch,
            rope_freq_scale=scale,
            rope_neox=arch != "llama",
            attn_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            tied_embeddings="output.weight" not in tensor_shapes,
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> LlamaConfig:
        arch = hf["model_type"]
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "linear"):
            raise ModelFileError(
                f"RoPE scaling type '{rope_type}' is not supported yet by the llama "
                "architecture plugin; use a model with default or linear RoPE"
            )
        return LlamaConfig(
            **default_head_dims(fields_from_hf(CONFIG_FIELDS, hf)),
            arch=arch,
            rope_freq_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_freq_scale=1.0 / float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
            rope_neox=True,
            attn_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
        )

    def gguf_metadata(self, c: LlamaConfig) -> dict[str, Any]:
        a = c.arch
        meta = {"general.architecture": a, **fields_to_gguf(CONFIG_FIELDS, c, a)}
        meta[f"{a}.block_count"] = c.n_layer + c.n_nextn  # the MTP blocks follow the main ones
        if c.rope_freq_scale != 1.0:
            meta[f"{a}.rope.scaling.type"] = "linear"
            meta[f"{a}.rope.scaling.factor"] = 1.0 / c.rope_freq_scale
        return meta

    def tensor_shapes(self, c: LlamaConfig) -> dict[str, tuple[int, ...]]:
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, c.n_embd)}
        for i in range(c.n_layer):
            p = f"blk.{i}."
            shapes[p + "attn_norm.weight"] = (c.n_embd,)
            shapes[p + "attn_q.weight"] = (q_dim, c.n_embd)
            shapes[p + "attn_k.weight"] = (kv_dim, c.n_embd)
            shapes[p + "attn_v.weight"] = (kv_dim, c.n_embd)
            if c.attn_bias:
                shapes[p + "attn_q.bias"] = (q_dim,)
                shapes[p + "attn_k.bias"] = (kv_dim,)
                shapes[p + "attn_v.bias"] = (kv_dim,)
            if c.qk_norm:
                shapes[p + "attn_q_norm.weight"] = (c.head_dim,)
                shapes[p + "attn_k_norm.weight"] = (c.head_dim,)
            shapes[p + "attn_output.weight"] = (c.n_embd, q_dim)
            shapes[p + "ffn_norm.weight"] = (c.n_embd,)
            shapes[p + "ffn_gate.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_up.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_down.weight"] = (c.n_embd, c.n_ff)
        shapes |= nextn_tensor_shapes(c)
        shapes["output_norm.weight"] = (c.n_embd,)
        if not c.tied_embeddings:
            shapes["output.weight"] = (c.n_vocab, c.n_embd)
        return shapes

    def tensors_from_hf(
        self, c: LlamaConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        skip = ("lm_head.weight",) if c.tied_embeddings else ()
        return tensors_from_hf(
            self.hf_names, c, hf_tensors, for_gguf, skip=skip, checkpoint=f"a {c.arch}"
        )

    def example_config(self, **overrides: Any) -> LlamaConfig:
        arch = overrides.get("arch", "llama")
        fields = {
            "arch": arch,
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_ff": 128,
            "n_head": 4,
            "n_head_kv": 2,
            "rms_eps": 1e-6 if arch != "llama" else 1e-5,
            "rope_neox": arch != "llama",
            "attn_bias": arch == "qwen2",
            "qk_norm": arch == "qwen3",
        } | overrides
        fields.setdefault("head_dim", fields["n_embd"] // fields["n_head"])
        return LlamaConfig(**fields)

    def required_ops(self, c: LlamaConfig) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", {"n_rot": c.head_dim, "head_dim": c.head_dim, "neox": c.rope_neox}),
            ("attention", {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}),
            ("set_rows", {}),
            ("swiglu", {}),
        ]

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


def nextn_tensor_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Tensors of the MTP blocks ``blk.{n_layer + i}``: a full decoder block plus
    llama.cpp's ``nextn.*`` tensors (the embedding and output head are the model's own)."""
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(c.n_layer, c.n_layer + c.n_nextn):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (c.n_embd,)
        shapes[p + "attn_q.weight"] = (q_dim, c.n_embd)
        shapes[p + "attn_k.weight"] = (kv_dim, c.n_embd)
        shapes[p + "attn_v.weight"] = (kv_dim, c.n_embd)
        shapes[p + "attn_output.weight"] = (c.n_embd, q_dim)
        shapes[p + "ffn_norm.weight"] = (c.n_embd,)
        shapes[p + "ffn_gate.weight"] = (c.n_ff, c.n_embd)
        shapes[p + "ffn_up.weight"] = (c.n_ff, c.n_embd)
        shapes[p + "ffn_down.weight"] = (c.n_embd, c.n_ff)
        shapes[p + "nextn.eh_proj.weight"] = (c.n_embd, 2 * c.n_embd)
        shapes[p + "nextn.enorm.weight"] = (c.n_embd,)
        shapes[p + "nextn.hnorm.weight"] = (c.n_embd,)
        shapes[p + "nextn.shared_head_norm.weight"] = (c.n_embd,)
    return shapes


@hookimpl
def tessera_register_architectures(register):
    register(LlamaArchitecture())

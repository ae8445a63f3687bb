"""The ``gemma4`` architecture: Gemma 4 text models (E2B, E4B and the dense sizes).

A pre-norm decoder with a norm after every sub-block, as transformers' ``Gemma4TextModel``:
sliding-window and global attention layers (global ones with a larger head and
proportional, partial RoPE), QK-norm and an unscaled V-norm, attention scale 1, GELU-tanh
gated FFN, per-layer embeddings (PLE: a token table plus a projection of the main
embedding, fed into every layer), a learned scalar per layer and final-logit soft-capping.

The E-series' upper ``num_kv_shared_layers`` layers write no KV: each reads the cache of
the last earlier layer of its own attention type, so :meth:`Gemma4Architecture.kv_layout`
gives them no cache tensors. The forward pass is in :mod:`tessera.models.gemma4.graph`.
GGUF keys and tensor names are llama.cpp's for ``gemma4``; the config is in
:mod:`tessera.models.gemma4.config`. Not supported: MoE blocks
(26B-A4B) and vision/audio towers (their tensors are skipped).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tessera.contract.arch import Architecture, KVLayerLayout, check_tensors
from tessera.contract.names import TensorNames, tensors_from_hf
from tessera.hookspecs import hookimpl
from tessera.models.gemma4 import config as gemma4_config
from tessera.models.gemma4.config import ARCH, Gemma4Config, per_layer

TESSERA_PLUGIN_API = 2


def _scalar(value: Any, c: Any) -> np.ndarray:
    return np.reshape(value, (1,))  # a 0-d scalar in HF, one value in GGUF


HF_NAMES = TensorNames(
    global_names={
        "embed_tokens.weight": "token_embd.weight",
        "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
        "per_layer_model_projection.weight": "per_layer_model_proj.weight",
        "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
        "norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.q_norm.weight": "attn_q_norm.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.k_norm.weight": "attn_k_norm.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
        "layer_scalar": "layer_output_scale.weight",
        "per_layer_input_gate.weight": "inp_gate.weight",
        "per_layer_projection.weight": "proj.weight",
        "post_per_layer_input_norm.weight": "post_norm.weight",
    },
    checkpoint="a Gemma 4",
    plugin="gemma4 architecture",
    layer_prefix="layers.",
    # the text model's prefix in multimodal checkpoints, then in text-only ones
    prefixes=("model.language_model.", "model."),
    # multimodal parts the text architecture does not run
    skip_prefixes=("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio."),
    skip_suffixes=("rotary_emb.inv_freq",),
    transforms={"layer_output_scale.weight": _scalar},
)


class Gemma4Architecture(Architecture):
    names = (ARCH,)
    hf_model_types = ("gemma4", "gemma4_text")

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> Gemma4Config:
        return gemma4_config.config_from_gguf(metadata, tensor_shapes)

    def config_from_hf(self, hf: Mapping[str, Any]) -> Gemma4Config:
        return gemma4_config.config_from_hf(hf)

    def gguf_metadata(self, c: Gemma4Config) -> dict[str, Any]:
        return gemma4_config.gguf_metadata(c)

    def tensor_shapes(self, c: Gemma4Config) -> dict[str, tuple[int, ...]]:
        e, p = c.n_embd, c.n_embd_per_layer
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, e)}
        if p:
            shapes["per_layer_token_embd.weight"] = (c.n_vocab, c.n_layer * p)
            shapes["per_layer_model_proj.weight"] = (c.n_layer * p, e)
            shapes["per_layer_proj_norm.weight"] = (p,)
        if not all(c.swa_layers):
            shapes["rope_freqs.weight"] = (c.head_dim // 2,)
        for i in range(c.n_layer):
            b, d, kv = f"blk.{i}.", c.layer_head_dim(i), c.n_head_kv[i] * c.layer_head_dim(i)
            shapes[b + "attn_norm.weight"] = (e,)
            shapes[b + "attn_q.weight"] = (c.n_head * d, e)
            shapes[b + "attn_q_norm.weight"] = (d,)
            if i < c.first_shared:
                shapes[b + "attn_k.weight"] = (kv, e)
                shapes[b + "attn_k_norm.weight"] = (d,)
                if not (c.k_eq_v and not c.swa_layers[i]):
                    shapes[b + "attn_v.weight"] = (kv, e)
            shapes[b + "attn_output.weight"] = (e, c.n_head * d)
            shapes[b + "post_attention_norm.weight"] = (e,)
            shapes[b + "ffn_norm.weight"] = (e,)
            shapes[b + "ffn_gate.weight"] = (c.n_ff[i], e)
            shapes[b + "ffn_up.weight"] = (c.n_ff[i], e)
            shapes[b + "ffn_down.weight"] = (e, c.n_ff[i])
            shapes[b + "post_ffw_norm.weight"] = (e,)
            shapes[b + "layer_output_scale.weight"] = (1,)
            if p:
                shapes[b + "inp_gate.weight"] = (p, e)
                shapes[b + "proj.weight"] = (e, p)
                shapes[b + "post_norm.weight"] = (e,)
        shapes["output_norm.weight"] = (e,)
        if not c.tied_embeddings:
            shapes["output.weight"] = (c.n_vocab, e)
        return shapes

    def tensors_from_hf(
        self, c: Gemma4Config, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        skip = ("lm_head.weight",) if c.tied_embeddings else ()
        yield from tensors_from_hf(HF_NAMES, c, hf_tensors, for_gguf, skip=skip)
        if not all(c.swa_layers):
            yield "rope_freqs.weight", c.rope_factors()  # computed: HF has no such tensor

    def example_config(self, **overrides: Any) -> Gemma4Config:
        n_layer = overrides.get("n_layer", 6)
        # half the layers share KV when each attention type has a producer below them
        n_kv_shared = overrides.setdefault("n_kv_shared", n_layer // 2 if n_layer >= 6 else 0)
        n_head_kv = overrides.pop("n_head_kv", 2)
        n_ff = overrides.pop("n_ff", 128)
        wide = overrides.pop("double_wide_ffn", False)
        overrides.pop("arch", None)
        fields = {
            "n_vocab": 256,
            "n_embd": 64,
            "n_layer": n_layer,
            "n_head": 4,
            "n_head_kv": per_layer(n_head_kv, n_layer),
            "n_ff": tuple(
                n_ff * (2 if wide and i >= n_layer - n_kv_shared else 1) for i in range(n_layer)
            ),
            # two sliding layers, then a global one; the last layer is always global
            "swa_layers": tuple((i + 1) % 3 != 0 and i != n_layer - 1 for i in range(n_layer)),
            "head_dim": 32,
            "head_dim_swa": 16,
            "n_swa": 8,
            "n_kv_shared": n_kv_shared,
            "n_embd_per_layer": 16,
            "partial_rotary_factor": 0.25,
            "final_logit_softcapping": 30.0,
        } | overrides
        return Gemma4Config(**fields)

    def example_tensors(self, c: Gemma4Config) -> dict[str, np.ndarray]:
        # Not free weights: RoPE factors, and layer scalars near 1 (as trained models have).
        rng = np.random.default_rng(c.n_layer)
        tensors = {
            f"blk.{i}.layer_output_scale.weight": (1.0 + rng.normal(0, 0.02, 1)).astype(np.float32)
            for i in range(c.n_layer)
        }
        if not all(c.swa_layers):
            tensors["rope_freqs.weight"] = c.rope_factors()
        return tensors

    def required_ops(self, c: Gemma4Config) -> list[tuple[str, dict[str, Any]]]:
        ops: list[tuple[str, dict[str, Any]]] = [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("scale", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("gelu", {}),
            ("set_rows", {}),
        ]
        for swa in sorted(set(c.swa_layers)):
            d = c.head_dim_swa if swa else c.head_dim
            op = "rope" if swa else "rope_ext"
            ops.append((op, {"n_rot": d, "head_dim": d, "neox": True}))
            kv = max(h for h, s in zip(c.n_head_kv, c.swa_layers, strict=True) if s == swa)
            ops.append(("attention", {"n_head": c.n_head, "n_head_kv": kv, "head_dim": d}))
        if c.final_logit_softcapping:
            ops.append(("tanh", {}))
        return ops

    def kv_layout(self, c: Gemma4Config) -> list[KVLayerLayout | None]:
        return [
            KVLayerLayout(c.n_head_kv[i], c.layer_head_dim(i), c.layer_head_dim(i))
            if i < c.first_shared
            else None
            for i in range(c.n_layer)
        ]

    def build(self, c: Gemma4Config, weights: Mapping[str, Any], backend: Any) -> Any:
        from tessera.models.gemma4.graph import Gemma4Graph

        check_tensors("gemma4", self.tensor_shapes(c), weights)
        return Gemma4Graph(c, weights, backend)


@hookimpl
def tessera_register_architectures(register):
    register(Gemma4Architecture())

"""The ``gemma4`` architecture: Gemma 4 text models (E2B, E4B and the dense sizes).

A pre-norm decoder with a norm after every sub-block, as transformers' ``Gemma4TextModel``:
sliding-window and global attention layers (global ones with a larger head and
proportional, partial RoPE), QK-norm and an unscaled V-norm, attention scale 1, GELU-tanh
gated FFN, per-layer embeddings (PLE: a token table plus a projection of the main
embedding, fed into every layer), a learned scalar per layer and final-logit soft-capping.

The E-series' upper ``num_kv_shared_layers`` layers write no KV: each reads the cache of
the last earlier layer of its own attention type, so :meth:`Gemma4Architecture.kv_layout`
gives them no cache tensors. The forward pass is in :mod:`tessera.models.gemma4_graph`.
GGUF keys and tensor names are llama.cpp's for ``gemma4``. Not supported: MoE blocks
(26B-A4B) and vision/audio towers (their tensors are skipped).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.arch import Architecture, KVLayerLayout
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 1

ARCH = "gemma4"
#: Divisor of RoPE pairs that do not rotate (llama.cpp's ``rope_freqs`` for proportional RoPE).
NO_ROTATION = 1e30


def _tuple(value: Any) -> tuple:
    return tuple(value)


@attrs.frozen
class Gemma4Config:
    """Hyper-parameters in GGUF terms; per-layer facts are tuples of length ``n_layer``."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: tuple[int, ...] = attrs.field(converter=_tuple)
    n_ff: tuple[int, ...] = attrs.field(converter=_tuple)
    #: True where the layer uses sliding-window attention (``sliding_window_pattern``).
    swa_layers: tuple[bool, ...] = attrs.field(converter=_tuple)
    head_dim: int  # global (full-attention) layers
    head_dim_swa: int
    n_swa: int
    n_kv_shared: int = 0
    #: Width of each layer's slice of the per-layer embedding (0: no PLE).
    n_embd_per_layer: int = 0
    rope_freq_base: float = 1_000_000.0
    rope_freq_base_swa: float = 10_000.0
    #: Rotated fraction of global layers' heads (proportional RoPE); 1.0 rotates all.
    #: None when read from GGUF, which stores the factors instead (``rope_freqs.weight``).
    partial_rotary_factor: float | None = 1.0
    rms_eps: float = 1e-6
    final_logit_softcapping: float = 0.0
    n_ctx_train: int = 131072
    tied_embeddings: bool = True
    #: Global layers without V projection reuse the raw K projection as V.
    k_eq_v: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("n_head_kv", "n_ff", "swa_layers"):
            if len(getattr(self, name)) != self.n_layer:
                raise ModelFileError(
                    f"{name} lists {len(getattr(self, name))} layers but the model has "
                    f"{self.n_layer}; the file is inconsistent — convert it again"
                )
        if not 0 <= self.n_kv_shared < self.n_layer:
            raise ModelFileError(
                f"{self.n_kv_shared} KV-shared layers do not fit in {self.n_layer} layers"
            )
        self.kv_sources()  # every shared layer must find a producer

    @property
    def first_shared(self) -> int:
        """Index of the first layer that writes no KV (``n_layer`` when none shares)."""
        return self.n_layer - self.n_kv_shared

    def layer_head_dim(self, il: int) -> int:
        return self.head_dim_swa if self.swa_layers[il] else self.head_dim

    def kv_sources(self) -> list[int]:
        """Per layer, the layer whose cache it attends to: itself, or for a KV-shared layer
        the last earlier non-shared layer of the same attention type."""
        sources = list(range(self.first_shared))
        for il in range(self.first_shared, self.n_layer):
            same = [
                j for j in range(self.first_shared) if self.swa_layers[j] == self.swa_layers[il]
            ]
            if not same:
                kind = "sliding" if self.swa_layers[il] else "global"
                raise ModelFileError(
                    f"KV-shared layer {il} is a {kind}-attention layer but no earlier layer of "
                    "that type writes KV; the model file is inconsistent"
                )
            sources.append(same[-1])
        return sources

    def rope_factors(self) -> np.ndarray:
        """``rope_freqs`` of global layers: 1 for rotated pairs, :data:`NO_ROTATION` after."""
        if self.partial_rotary_factor is None:
            raise ValueError("this config was read from GGUF: its RoPE factors are a tensor")
        n_pairs = self.head_dim // 2
        n_rotated = int(self.partial_rotary_factor * self.head_dim // 2)
        return np.where(np.arange(n_pairs) < n_rotated, 1.0, NO_ROTATION).astype(np.float32)


_HF_LAYER_NAMES = {
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
}
_HF_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
    "norm.weight": "output_norm.weight",
}
#: Prefixes of the text model in HF checkpoints (multimodal first).
_HF_PREFIXES = ("model.language_model.", "model.")
#: Multimodal parts the text architecture does not run.
_HF_SKIPPED = (
    "model.vision_tower.",
    "model.audio_tower.",
    "model.embed_vision.",
    "model.embed_audio.",
)


def _per_layer(value: Any, n_layer: int) -> tuple[int, ...]:
    """A GGUF key that is a scalar or one value per layer, as a per-layer tuple."""
    if isinstance(value, list | tuple | np.ndarray):
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


class Gemma4Architecture(Architecture):
    names = (ARCH,)
    hf_model_types = ("gemma4", "gemma4_text")

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> Gemma4Config:
        def key(name: str, default: Any = None) -> Any:
            value = metadata.get(f"{ARCH}.{name}", default)
            if value is None:
                raise ModelFileError(
                    f"the GGUF metadata lacks '{ARCH}.{name}'; the file is incomplete — "
                    "convert the model again"
                )
            return value

        if any(".ffn_gate_inp." in name for name in tensor_shapes):
            raise ModelFileError(
                "this Gemma 4 model has MoE layers, which the gemma4 plugin does not run yet; "
                "use a dense Gemma 4 model (E2B, E4B, 31B)"
            )
        n_layer = int(key("block_count"))
        n_embd = int(key("embedding_length"))
        head_dim = int(key("attention.key_length"))
        n_vocab = metadata.get(f"{ARCH}.vocab_size") or tensor_shapes["token_embd.weight"][0]
        return Gemma4Config(
            n_vocab=int(n_vocab),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=int(key("attention.head_count")),
            n_head_kv=_per_layer(key("attention.head_count_kv"), n_layer),
            n_ff=_per_layer(key("feed_forward_length"), n_layer),
            swa_layers=tuple(bool(v) for v in key("attention.sliding_window_pattern")),
            head_dim=head_dim,
            head_dim_swa=int(key("attention.key_length_swa")),
            n_swa=int(key("attention.sliding_window")),
            n_kv_shared=int(key("attention.shared_kv_layers", 0)),
            n_embd_per_layer=int(key("embedding_length_per_layer_input", 0)),
            rope_freq_base=float(key("rope.freq_base", 1_000_000.0)),
            rope_freq_base_swa=float(key("rope.freq_base_swa", 10_000.0)),
            partial_rotary_factor=None,  # the graph reads rope_freqs.weight
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            final_logit_softcapping=float(key("final_logit_softcapping", 0.0)),
            n_ctx_train=int(key("context_length", 131072)),
            tied_embeddings="output.weight" not in tensor_shapes,
            k_eq_v=any(
                f"blk.{i}.attn_k.weight" in tensor_shapes
                and f"blk.{i}.attn_v.weight" not in tensor_shapes
                for i in range(n_layer)
            ),
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> Gemma4Config:
        if hf.get("model_type") == "gemma4":
            hf = hf.get("text_config") or {}
        if hf.get("enable_moe_block"):
            raise ModelFileError(
                "this Gemma 4 model has MoE layers, which the gemma4 plugin does not run yet; "
                "use a dense Gemma 4 model (E2B, E4B, 31B)"
            )
        n_layer = int(hf["num_hidden_layers"])
        types = list(hf.get("layer_types") or [])
        if not types:
            types = [
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                for i in range(n_layer)
            ]
        types[-1] = "full_attention"  # transformers forces the last layer global
        swa = tuple(t == "sliding_attention" for t in types)
        per_layer = {int(k): v for k, v in (hf.get("per_layer_config") or {}).items()}
        head_dim_swa = int(hf.get("head_dim") or 256)
        head_dim = int(hf.get("global_head_dim") or 512)
        for i, t in enumerate(swa):
            if not t and "head_dim" in per_layer.get(i, {}):
                head_dim = int(per_layer[i]["head_dim"])
        k_eq_v = bool(hf.get("attention_k_eq_v", False))
        kv_global = hf.get("num_global_key_value_heads") if k_eq_v else None
        n_head_kv = tuple(
            int(
                per_layer.get(i, {}).get("num_key_value_heads")
                or (kv_global if not swa[i] and kv_global else hf["num_key_value_heads"])
            )
            for i in range(n_layer)
        )
        n_kv_shared = int(hf.get("num_kv_shared_layers") or 0)
        wide = bool(hf.get("use_double_wide_mlp")) and n_kv_shared > 0
        n_ff = tuple(
            int(hf["intermediate_size"]) * (2 if wide and i >= n_layer - n_kv_shared else 1)
            for i in range(n_layer)
        )
        rope = hf.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        return Gemma4Config(
            n_vocab=int(hf["vocab_size"]),
            n_embd=int(hf["hidden_size"]),
            n_layer=n_layer,
            n_head=int(hf["num_attention_heads"]),
            n_head_kv=n_head_kv,
            n_ff=n_ff,
            swa_layers=swa,
            head_dim=head_dim,
            head_dim_swa=head_dim_swa,
            n_swa=int(hf.get("sliding_window") or 512),
            n_kv_shared=n_kv_shared,
            n_embd_per_layer=int(hf.get("hidden_size_per_layer_input") or 0),
            rope_freq_base=float(full.get("rope_theta", 1_000_000.0)),
            rope_freq_base_swa=float(local.get("rope_theta", 10_000.0)),
            partial_rotary_factor=float(full.get("partial_rotary_factor", 1.0)),
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            final_logit_softcapping=float(hf.get("final_logit_softcapping") or 0.0),
            n_ctx_train=int(hf.get("max_position_embeddings", 131072)),
            tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
            k_eq_v=k_eq_v,
        )

    def gguf_metadata(self, c: Gemma4Config) -> dict[str, Any]:
        a = ARCH
        meta = {
            "general.architecture": a,
            f"{a}.vocab_size": c.n_vocab,
            f"{a}.context_length": c.n_ctx_train,
            f"{a}.embedding_length": c.n_embd,
            f"{a}.block_count": c.n_layer,
            f"{a}.feed_forward_length": list(c.n_ff),
            f"{a}.attention.head_count": c.n_head,
            f"{a}.attention.head_count_kv": list(c.n_head_kv),
            f"{a}.attention.key_length": c.head_dim,
            f"{a}.attention.value_length": c.head_dim,
            f"{a}.attention.key_length_swa": c.head_dim_swa,
            f"{a}.attention.value_length_swa": c.head_dim_swa,
            f"{a}.attention.layer_norm_rms_epsilon": c.rms_eps,
            f"{a}.attention.sliding_window": c.n_swa,
            f"{a}.attention.sliding_window_pattern": list(c.swa_layers),
            f"{a}.attention.shared_kv_layers": c.n_kv_shared,
            f"{a}.embedding_length_per_layer_input": c.n_embd_per_layer,
            f"{a}.rope.freq_base": c.rope_freq_base,
            f"{a}.rope.freq_base_swa": c.rope_freq_base_swa,
            f"{a}.rope.dimension_count": c.head_dim,
            f"{a}.rope.dimension_count_swa": c.head_dim_swa,
        }
        if c.final_logit_softcapping:
            meta[f"{a}.final_logit_softcapping"] = c.final_logit_softcapping
        return meta

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
        for hf_name in hf_tensors:
            if hf_name.startswith(_HF_SKIPPED) or hf_name.endswith("rotary_emb.inv_freq"):
                continue
            if hf_name == "lm_head.weight":
                if not c.tied_embeddings:
                    yield "output.weight", hf_tensors[hf_name]
                continue
            rest = next((hf_name[len(p) :] for p in _HF_PREFIXES if hf_name.startswith(p)), "")
            name = _HF_GLOBAL_NAMES.get(rest)
            if name is None and rest.startswith("layers."):
                layer, _, part = rest[len("layers.") :].partition(".")
                if part in _HF_LAYER_NAMES:
                    name = f"blk.{layer}.{_HF_LAYER_NAMES[part]}"
            if name is None:
                raise ModelFileError(
                    f"unexpected tensor '{hf_name}' in a Gemma 4 checkpoint; the gemma4 "
                    "architecture plugin does not know where it goes"
                )
            value = hf_tensors[hf_name]
            yield name, np.reshape(value, (1,)) if name.endswith("output_scale.weight") else value
        if not all(c.swa_layers):
            yield "rope_freqs.weight", c.rope_factors()

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
            "n_head_kv": _per_layer(n_head_kv, n_layer),
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
        from tessera.models.gemma4_graph import Gemma4Graph

        missing = [n for n in self.tensor_shapes(c) if n not in weights]
        if missing:
            raise ModelFileError(
                f"the model lacks tensor '{missing[0]}' (and {len(missing) - 1} more) that a "
                "gemma4 model needs; the file is incomplete — convert it again"
            )
        return Gemma4Graph(c, weights, backend)


@hookimpl
def tessera_register_architectures(register):
    register(Gemma4Architecture())

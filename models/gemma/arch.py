"""What the ``gemma2`` and ``gemma3`` architectures share: tensors, KV layout, ops, the build.

Both are pre- and post-norm decoders (four RMSNorms per layer) with GQA, NeoX RoPE,
GELU(tanh)-gated FFNs, embeddings scaled by ``sqrt(n_embd)``, tied output and layers that
alternate between sliding-window and global attention. Gemma 2 caps attention scores and
final logits (``tanh`` soft-capping); Gemma 3 normalizes Q and K per head, gives sliding
layers their own RoPE base and scales only the global layers' RoPE. Each family's module
(:mod:`tessera.models.gemma.gemma2`, :mod:`tessera.models.gemma.gemma3`) reads and writes
its own GGUF keys and config.json fields into one :class:`~tessera.models.gemma.config.GemmaConfig`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tessera.contract.arch import Architecture, KVLayerLayout, check_tensors
from tessera.contract.names import tensors_from_hf
from tessera.models.gemma.config import HF_NAMES, GemmaConfig, swa_pattern


class GemmaArchitecture(Architecture):
    """The parts of the Gemma 2 / Gemma 3 architectures that do not depend on the family."""

    #: The period of llama.cpp's sliding-window pattern when GGUF states none.
    default_pattern: int = 2

    def tensor_shapes(self, c: GemmaConfig) -> dict[str, tuple[int, ...]]:
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.n_vocab, c.n_embd)}
        for i in range(c.n_layer):
            p = f"blk.{i}."
            for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                shapes[p + norm + ".weight"] = (c.n_embd,)
            shapes[p + "attn_q.weight"] = (q_dim, c.n_embd)
            shapes[p + "attn_k.weight"] = (kv_dim, c.n_embd)
            shapes[p + "attn_v.weight"] = (kv_dim, c.n_embd)
            if c.qk_norm:
                shapes[p + "attn_q_norm.weight"] = (c.head_dim,)
                shapes[p + "attn_k_norm.weight"] = (c.head_dim,)
            shapes[p + "attn_output.weight"] = (c.n_embd, q_dim)
            shapes[p + "ffn_gate.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_up.weight"] = (c.n_ff, c.n_embd)
            shapes[p + "ffn_down.weight"] = (c.n_embd, c.n_ff)
        shapes["output_norm.weight"] = (c.n_embd,)
        if not c.tied_embeddings:
            shapes["output.weight"] = (c.n_vocab, c.n_embd)
        return shapes

    def tensors_from_hf(
        self, c: GemmaConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        skip = ("lm_head.weight",) if c.tied_embeddings else ()
        return tensors_from_hf(
            HF_NAMES, c, hf_tensors, for_gguf, skip=skip, checkpoint=f"a {c.arch}"
        )

    def example_config(self, **overrides: Any) -> GemmaConfig:
        overrides.pop("arch", None)
        n_layer = overrides.get("n_layer", 2)
        fields = (
            {
                "arch": self.names[0],
                "n_vocab": 256,
                "n_embd": 64,
                "n_layer": n_layer,
                "n_ff": 128,
                "n_head": 4,
                "n_head_kv": 2,
                # a sliding layer, then a global one; a window shorter than the kit's prompt
                "swa_layers": swa_pattern(n_layer, 2),
                "n_swa": 4,
            }
            | self.example_fields()
            | overrides
        )
        fields.setdefault("head_dim", fields["n_embd"] // fields["n_head"])
        fields.setdefault("query_pre_attn_scalar", float(fields["head_dim"]))
        return GemmaConfig(**fields)

    def example_fields(self) -> dict[str, Any]:
        """The family's own example settings (caps, QK-norm, RoPE)."""
        return {}

    def required_ops(self, c: GemmaConfig) -> list[tuple[str, dict[str, Any]]]:
        attention = "attention_softcap" if c.attn_softcap else "attention"
        ops: list[tuple[str, dict[str, Any]]] = [
            ("get_rows", {}),
            ("matmul", {}),
            ("add", {}),
            ("mul", {}),
            ("scale", {}),
            ("rms_norm", {"n": c.n_embd}),
            ("rope", {"n_rot": c.head_dim, "head_dim": c.head_dim, "neox": True}),
            (attention, {"n_head": c.n_head, "n_head_kv": c.n_head_kv, "head_dim": c.head_dim}),
            ("set_rows", {}),
            ("gelu", {}),
        ]
        if c.final_softcap:
            ops.append(("tanh", {}))
        return ops

    def kv_layout(self, c: GemmaConfig) -> list[KVLayerLayout | None]:
        return [KVLayerLayout(c.n_head_kv, c.head_dim, c.head_dim)] * c.n_layer

    def build(self, c: GemmaConfig, weights: Mapping[str, Any], backend: Any) -> Any:
        from tessera.models.gemma.graph import GemmaGraph

        check_tensors(c.arch, self.tensor_shapes(c), weights)
        return GemmaGraph(c, weights, backend)

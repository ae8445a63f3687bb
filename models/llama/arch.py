"""The ``llama`` architecture family: Llama, Qwen2 and Qwen3 (GGUF and Hugging Face).

One pre-norm decoder: RMSNorm -> attention with GQA and RoPE -> residual -> RMSNorm ->
SwiGLU FFN -> residual. The family members differ only in small facts this module reads
from metadata: Qwen2 adds Q/K/V biases, Qwen3 normalizes Q and K per head (QK-norm), and
GGUF ``llama`` files store Q/K rows permuted for GGML's normal-mode RoPE while every other
case uses NeoX-style RoPE on unpermuted weights. The config, its GGUF keys and HF fields and
the HF tensor names are declared in :mod:`tessera.models.llama.config`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from tessera.contract.arch import (
    Architecture,
    ForwardInput,
    KVLayerLayout,
    check_tensors,
    metadata_key,
)
from tessera.contract.fusion import LLAMA_DECODER, DecoderBlock
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


class LlamaGraph:
    """The forward pass of a llama-family model on one backend."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = config
        self.w = weights
        self.b = backend
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.attn_scale = 1.0 / math.sqrt(config.head_dim)
        #: When a list, each forward appends its output rows' last hidden state to it.
        self.hidden_sink: list[Any] | None = None
        self._blocks: list[DecoderBlock] | None = None  # made on the first decode step
        # Asked once, when the model loads (so switches read then apply to this model).
        # A subclass that changes a block (tensor parallel, MoE FFNs) runs its own ops.
        same = type(self)._attention is LlamaGraph._attention
        same = same and type(self)._ffn is LlamaGraph._ffn
        self._fusion = backend.fusion(LLAMA_DECODER) if same else None

    def _project(self, x: Any, name: str) -> Any:
        y = self.b.matmul(x, self.w[name + ".weight"])
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.b.add(y, bias)

    def _attention(self, il: int, x: Any, inp: ForwardInput) -> Any:
        b, c, p = self.b, self.c, f"blk.{il}."
        n_tokens = len(inp.tokens)
        names = (p + "attn_q", p + "attn_k", p + "attn_v")
        q, k, v = b.matmul_n(
            x, [self.w[n + ".weight"] for n in names], [self.w.get(n + ".bias") for n in names]
        )
        q = q.reshape(n_tokens, c.n_head, c.head_dim)
        k = k.reshape(n_tokens, c.n_head_kv, c.head_dim)
        v = v.reshape(n_tokens, c.n_head_kv, c.head_dim)
        if c.qk_norm:
            q = b.rms_norm(q, self.w[p + "attn_q_norm.weight"], c.rms_eps)
            k = b.rms_norm(k, self.w[p + "attn_k_norm.weight"], c.rms_eps)
        q = b.rope(q, inp.positions, c.head_dim, c.rope_freq_base, c.rope_neox, c.rope_freq_scale)
        k = b.rope(k, inp.positions, c.head_dim, c.rope_freq_base, c.rope_neox, c.rope_freq_scale)
        kv = inp.kv
        b.set_rows(kv.k[il], kv.cells, k)
        b.set_rows(kv.v[il], kv.cells, v)
        out = kv.attend(b, il, q, self.attn_scale)
        return self._project(out, p + "attn_output")

    def forward(self, inp: ForwardInput) -> Any:
        b, c = self.b, self.c
        x = b.get_rows(self.w["token_embd.weight"], inp.tokens)
        all_rows = len(inp.output_rows) == len(inp.tokens)
        kv = inp.kv
        decode = len(inp.tokens) == 1 and all_rows and kv.path == "rows"
        blocks = self._decoder_blocks() if decode else None
        rows, cell = (kv.rows_for(), int(kv.cells[0])) if blocks is not None else (None, 0)
        for il in range(c.n_layer):
            p = f"blk.{il}."
            if blocks is not None:
                # decode: the whole block in one call where a fusion serves this backend
                y = self._fusion.run(
                    b, x, blocks[il], kv.k[il], kv.v[il], cell, rows, inp.positions
                )
                if y is not None:
                    x = y
                    continue
            attn = self._attention(
                il, b.rms_norm(x, self.w[p + "attn_norm.weight"], c.rms_eps), inp
            )
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows that need logits go through the last FFN and the head.
                attn = b.get_rows(attn, inp.output_rows)
                x = b.get_rows(x, inp.output_rows)
            x = b.add(x, attn)
            h = b.rms_norm(x, self.w[p + "ffn_norm.weight"], c.rms_eps)
            x = b.add(x, self._ffn(il, h))
        if self.hidden_sink is not None:
            self.hidden_sink.append(x)  # MTP drafting reads h_i before the final norm
        x = b.rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x  # embedding mode: the core pools hidden states; no LM head
        return self._logits(x)

    def _decoder_blocks(self) -> list[DecoderBlock] | None:
        """Each layer as a :class:`DecoderBlock` for the backend's block fusion, made
        once; None when no fusion serves this model."""
        if self._fusion is None:
            return None
        if self._blocks is None:
            self._blocks = [self._decoder_block(il) for il in range(self.c.n_layer)]
        return self._blocks

    def _decoder_block(self, il: int) -> DecoderBlock:
        c, w, p = self.c, self.w, f"blk.{il}."
        return DecoderBlock(
            attn_norm=w[p + "attn_norm.weight"],
            wq=w[p + "attn_q.weight"],
            wk=w[p + "attn_k.weight"],
            wv=w[p + "attn_v.weight"],
            wo=w[p + "attn_output.weight"],
            ffn_norm=w[p + "ffn_norm.weight"],
            w_gate=w[p + "ffn_gate.weight"],
            w_up=w[p + "ffn_up.weight"],
            w_down=w[p + "ffn_down.weight"],
            bq=w.get(p + "attn_q.bias"),
            bk=w.get(p + "attn_k.bias"),
            bv=w.get(p + "attn_v.bias"),
            q_norm=w.get(p + "attn_q_norm.weight") if c.qk_norm else None,
            k_norm=w.get(p + "attn_k_norm.weight") if c.qk_norm else None,
            n_head=c.n_head,
            n_head_kv=c.n_head_kv,
            head_dim=c.head_dim,
            n_rot=c.head_dim,
            rms_eps=c.rms_eps,
            rope_freq_base=c.rope_freq_base,
            rope_freq_scale=c.rope_freq_scale,
            rope_neox=c.rope_neox,
            attn_scale=self.attn_scale,
        )

    def _ffn(self, il: int, h: Any) -> Any:
        """SwiGLU FFN of layer ``il`` (tensor parallel overrides it to sum partial outputs)."""
        b, p = self.b, f"blk.{il}."
        act = b.gate_up_swiglu(h, self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"])
        return b.matmul(act, self.w[p + "ffn_down.weight"])

    def _logits(self, x: Any) -> Any:
        """The LM head over normalized hidden states (tensor parallel may split it by vocab)."""
        return self.b.matmul(x, self.output)


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

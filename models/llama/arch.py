"""The ``llama`` architecture family: Llama, Qwen2 and Qwen3 (GGUF and Hugging Face).

One pre-norm decoder: RMSNorm -> attention with GQA and RoPE -> residual -> RMSNorm ->
SwiGLU FFN -> residual. The family members differ only in small facts this module reads
from metadata: Qwen2 adds Q/K/V biases, Qwen3 normalizes Q and K per head (QK-norm), and
GGUF ``llama`` files store Q/K rows permuted for GGML's normal-mode RoPE while every other
case uses NeoX-style RoPE on unpermuted weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import (
    Architecture,
    ForwardInput,
    KVLayerLayout,
    check_tensors,
    dims_from_hf,
    metadata_key,
)
from tessera.contract.fusion import LLAMA_DECODER, DecoderBlock
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 1

ARCHS = ("llama", "qwen2", "qwen3")


@attrs.frozen
class LlamaConfig:
    """Hyper-parameters of one llama-family model, in GGUF terms."""

    arch: str = attrs.field(validator=attrs.validators.in_(ARCHS))
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int = 4096
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rms_eps: float = 1e-5
    #: True: NeoX pairs (i, i + n_rot/2) on unpermuted Q/K; False: GGML normal mode.
    rope_neox: bool = True
    attn_bias: bool = False
    qk_norm: bool = False
    tied_embeddings: bool = False
    #: MTP ("nextn") blocks stored after the main ones (GGUF ``{arch}.nextn_predict_layers``;
    #: ``block_count`` counts them too). The main forward pass never runs them.
    n_nextn: int = 0

    def __attrs_post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )


def _permute_for_normal_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder each head's rows from NeoX halves to interleaved pairs (llama.cpp's layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_HF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


class LlamaArchitecture(Architecture):
    names = ARCHS
    hf_model_types = ARCHS

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> LlamaConfig:
        arch = metadata["general.architecture"]
        if arch == "llama" and metadata.get("llama.expert_count"):  # Mixtral: routed experts
            return _moe_architecture().config_from_gguf(metadata, tensor_shapes)

        def key(name: str, default: Any = None) -> Any:
            return metadata_key(metadata, arch, name, default)

        n_embd = int(key("embedding_length"))
        n_nextn = int(metadata.get(f"{arch}.nextn_predict_layers", 0))
        n_head = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", n_embd // n_head))
        n_vocab = (
            metadata.get(f"{arch}.vocab_size")
            or tensor_shapes.get(
                "token_embd.weight", (len(metadata.get("tokenizer.ggml.tokens", [])),)
            )[0]
        )
        scale = 1.0
        if metadata.get(f"{arch}.rope.scaling.type", "none") == "linear":
            scale = 1.0 / float(key("rope.scaling.factor"))
        return LlamaConfig(
            arch=arch,
            n_vocab=int(n_vocab),
            n_embd=n_embd,
            n_layer=int(key("block_count")) - n_nextn,
            n_ff=int(key("feed_forward_length")),
            n_head=n_head,
            n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            n_ctx_train=int(key("context_length", 4096)),
            rope_freq_base=float(key("rope.freq_base", 10000.0)),
            rope_freq_scale=scale,
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_neox=arch != "llama",
            attn_bias=arch == "qwen2",
            qk_norm=arch == "qwen3",
            tied_embeddings="output.weight" not in tensor_shapes,
            n_nextn=n_nextn,
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
            arch=arch,
            **dims_from_hf(hf),
            n_ctx_train=int(hf.get("max_position_embeddings", 4096)),
            rope_freq_base=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rope_freq_scale=1.0 / float(rope.get("factor", 1.0)) if rope_type == "linear" else 1.0,
            rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_neox=True,
            attn_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )

    def gguf_metadata(self, c: LlamaConfig) -> dict[str, Any]:
        a = c.arch
        meta = {
            "general.architecture": a,
            f"{a}.vocab_size": c.n_vocab,
            f"{a}.context_length": c.n_ctx_train,
            f"{a}.embedding_length": c.n_embd,
            f"{a}.block_count": c.n_layer + c.n_nextn,
            f"{a}.feed_forward_length": c.n_ff,
            f"{a}.attention.head_count": c.n_head,
            f"{a}.attention.head_count_kv": c.n_head_kv,
            f"{a}.attention.key_length": c.head_dim,
            f"{a}.attention.value_length": c.head_dim,
            f"{a}.attention.layer_norm_rms_epsilon": c.rms_eps,
            f"{a}.rope.freq_base": c.rope_freq_base,
            f"{a}.rope.dimension_count": c.head_dim,
        }
        if c.n_nextn:
            meta[f"{a}.nextn_predict_layers"] = c.n_nextn
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
        permute = for_gguf and c.arch == "llama"
        for hf_name in hf_tensors:
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue
            if hf_name == "lm_head.weight" and c.tied_embeddings:
                continue
            name = _HF_GLOBAL_NAMES.get(hf_name)
            if name is None and hf_name.startswith("model.layers."):
                layer, _, rest = hf_name[len("model.layers.") :].partition(".")
                if rest in _HF_LAYER_NAMES:
                    name = f"blk.{layer}.{_HF_LAYER_NAMES[rest]}"
            if name is None:
                raise ModelFileError(
                    f"unexpected tensor '{hf_name}' in a {c.arch} checkpoint; the "
                    "llama architecture plugin does not know where it goes"
                )
            value = hf_tensors[hf_name]
            if permute and name.endswith(("attn_q.weight", "attn_q.bias")):
                value = _permute_for_normal_rope(np.asarray(value), c.n_head)
            elif permute and name.endswith(("attn_k.weight", "attn_k.bias")):
                value = _permute_for_normal_rope(np.asarray(value), c.n_head_kv)
            yield name, value

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

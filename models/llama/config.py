"""The llama family's config and how it is stored: what each GGUF architecture name fixes
about the block (:data:`TRAITS`), the GGUF keys and ``config.json`` fields of each config
field and the Hugging Face tensor names (see :mod:`tessera.models.llama.arch`, which reads
and writes them)."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from tessera.contract.names import REQUIRED, ConfigField, TensorNames
from tessera.models.llama.rope import RopeScaling

#: The dense GGUF architectures of the family (the MoE ones are in ``moe.py``).
ARCHS = ("llama", "qwen2", "qwen3", "mistral3", "smollm3", "granite", "olmo2", "phi3", "glm4")
#: MoE archs whose attention half has no dense arch of its own (it is their base).
MOE_BASES = ("glm4moe",)


@attrs.frozen
class ArchTraits:
    """What a GGUF architecture name fixes about the block, as llama.cpp's code for it does."""

    #: NeoX pairs on unpermuted Q/K rows; False: GGML normal mode on rows llama.cpp's
    #: converter permuted (``undo_permute``).
    rope_neox: bool
    #: transformers itself turns interleaved pairs (GLM-4): HF weights already suit GGML's
    #: normal mode, so they are not permuted and HF folders rotate in normal mode too.
    hf_interleaved: bool = False
    attn_bias: bool = False
    #: RMSNorm of Q and K per head (Qwen3) or over the whole projection (OLMo 2).
    qk_norm: bool = False
    qk_norm_full: bool = False
    #: Norms before attention and the FFN (all but OLMo 2) and after them, on each
    #: branch before its residual add (OLMo 2 instead of the norms before, GLM-4 as well).
    pre_norms: bool = True
    post_norms: bool = False
    #: One ``attn_qkv`` tensor (Phi-3) and one ``ffn_up`` of gate and up rows (Phi-3, GLM-4).
    fused_qkv: bool = False
    fused_gate_up: bool = False
    #: GGUF name of the norm before the FFN (llama.cpp's GLM-4.5 calls it
    #: ``post_attention_norm``).
    ffn_norm: str = "ffn_norm"
    #: The MTP block reads the target's hidden state after ``output_norm`` (and feeds its
    #: own back after ``shared_head_norm``), as llama.cpp runs GLM-4.5's; False: before
    #: the norms (the bundled default model's trained head).
    nextn_normed_h: bool = False
    #: Every ``nope_step``-th layer runs without RoPE (SmolLM3; llama.cpp fixes it at 4).
    nope_step: int = 0
    #: The extra GGUF keys the architecture reads (granite's multipliers ...).
    fields: tuple[ConfigField, ...] = ()


#: Granite's multipliers: embeddings, residual branches and attention scores are scaled,
#: logits divided (``logit_scale``); ``attention.scale`` 0 means ``1/sqrt(head_dim)``.
GRANITE_FIELDS = (
    ConfigField("embedding_scale", "embedding_scale", "embedding_multiplier", float, 1.0),
    ConfigField("residual_scale", "residual_scale", "residual_multiplier", float, 1.0),
    ConfigField("logit_scale", "logit_scale", "logits_scaling", float, 1.0),
    ConfigField("attention_scale", "attention.scale", "attention_multiplier", float, 0.0, 1.0),
)
#: Ministral 3's attention temperature (HF ``rope_parameters.llama_4_scaling_beta``).
MISTRAL3_FIELDS = (
    ConfigField(
        "attn_temp_scale", "attention.temperature_scale", (), float, 0.0, omit_default=True
    ),
)

TRAITS = {
    "llama": ArchTraits(rope_neox=False),
    "qwen2": ArchTraits(rope_neox=True, attn_bias=True),
    "qwen3": ArchTraits(rope_neox=True, qk_norm=True),
    "mistral3": ArchTraits(rope_neox=False, fields=MISTRAL3_FIELDS),
    "smollm3": ArchTraits(rope_neox=False, nope_step=4),
    "granite": ArchTraits(rope_neox=False, fields=GRANITE_FIELDS),
    "olmo2": ArchTraits(rope_neox=True, qk_norm_full=True, pre_norms=False, post_norms=True),
    "phi3": ArchTraits(rope_neox=True, fused_qkv=True, fused_gate_up=True),
    "glm4": ArchTraits(rope_neox=False, hf_interleaved=True, post_norms=True, fused_gate_up=True),
    # the MoE architectures' attention is their base's
    "qwen3moe": ArchTraits(rope_neox=True, qk_norm=True),
    "qwen2moe": ArchTraits(rope_neox=True, attn_bias=True),
    "granitemoe": ArchTraits(rope_neox=False, fields=GRANITE_FIELDS),
    "glm4moe": ArchTraits(rope_neox=True, ffn_norm="post_attention_norm", nextn_normed_h=True),
}


def _layers(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen
class LlamaConfig:
    """Hyper-parameters of one llama-family model, in GGUF terms."""

    arch: str = attrs.field(validator=attrs.validators.in_(ARCHS + MOE_BASES))
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    #: Rotated values per head (``rope.dimension_count``; Phi-3's partial rotary).
    n_rot: int = attrs.field(default=attrs.Factory(lambda self: self.head_dim, takes_self=True))
    n_ctx_train: int = 4096
    rope_freq_base: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_scaling: RopeScaling = RopeScaling()
    rms_eps: float = 1e-5
    #: True: NeoX pairs (i, i + n_rot/2) on unpermuted Q/K; False: GGML normal mode.
    rope_neox: bool = True
    attn_bias: bool = False
    qk_norm: bool = False
    qk_norm_full: bool = False
    pre_norms: bool = True
    post_norms: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    #: Layers that run without RoPE (SmolLM3's NoPE layers).
    nope_layers: tuple[int, ...] = attrs.field(default=(), converter=_layers)
    #: Sliding-window attention of every layer (Mistral 7B v0.1, Phi-3 mini); 0 = none.
    n_swa: int = 0
    #: Q scaled by ``1 + t ln(1 + floor(pos / n_ctx_orig))`` (Ministral 3); 0 = none.
    attn_temp_scale: float = 0.0
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    attention_scale: float = 0.0
    tied_embeddings: bool = False
    #: MTP ("nextn") blocks stored after the main ones (GGUF ``{arch}.nextn_predict_layers``;
    #: ``block_count`` counts them too). The main forward pass never runs them.
    n_nextn: int = 0

    def __attrs_post_init__(self) -> None:
        if self.n_head % self.n_head_kv:
            raise ValueError(
                f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})"
            )

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


def block_traits(t: ArchTraits) -> dict[str, bool]:
    """The config fields a GGUF architecture name fixes about every block."""
    names = ("qk_norm", "qk_norm_full", "pre_norms", "post_norms", "fused_qkv", "fused_gate_up")
    return {name: getattr(t, name) for name in names}


def nope_layers(step: int, n_layer: int) -> tuple[int, ...]:
    """The layers without RoPE when every ``step``-th one has none (0: every layer has it)."""
    return tuple(il for il in range(n_layer) if step and (il + 1) % step == 0)


def _permute_for_normal_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder each head's rows from NeoX halves to interleaved pairs (llama.cpp's layout)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _permuted(arch: str) -> bool:
    """Whether llama.cpp's converter permutes the arch's Q/K rows (normal-mode RoPE on HF
    weights that turn NeoX pairs)."""
    t = TRAITS[arch]
    return not (t.rope_neox or t.hf_interleaved)


def _permute_q(w: Any, c: LlamaConfig) -> Any:
    return _permute_for_normal_rope(np.asarray(w), c.n_head) if _permuted(c.arch) else w


def _permute_k(w: Any, c: LlamaConfig) -> Any:
    return _permute_for_normal_rope(np.asarray(w), c.n_head_kv) if _permuted(c.arch) else w


HF_NAMES = TensorNames(
    global_names={
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
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
    },
    checkpoint="a llama",
    plugin="llama architecture",
    skip_suffixes=("rotary_emb.inv_freq",),
    gguf_transforms={
        "attn_q.weight": _permute_q,
        "attn_q.bias": _permute_q,
        "attn_k.weight": _permute_k,
        "attn_k.bias": _permute_k,
    },
)
#: OLMo 2: the two norms follow attention and the FFN (llama.cpp's post-norm names).
OLMO2_HF_NAMES = attrs.evolve(
    HF_NAMES,
    layer_names={
        **{k: v for k, v in HF_NAMES.layer_names.items() if k != "input_layernorm.weight"},
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    },
)
#: Phi-3: fused Q/K/V rows and fused gate/up rows.
PHI3_HF_NAMES = attrs.evolve(
    HF_NAMES,
    layer_names={
        **HF_NAMES.layer_names,
        "self_attn.qkv_proj.weight": "attn_qkv.weight",
        "mlp.gate_up_proj.weight": "ffn_up.weight",
    },
)
CONFIG_FIELDS = (
    ConfigField("n_vocab", "vocab_size", "vocab_size", default=None, hf_default=REQUIRED),
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=4096),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),  # GGUF: + n_nextn
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    # None when not stated: default_head_dims derives them
    ConfigField("n_head_kv", "attention.head_count_kv", "num_key_value_heads", default=None),
    ConfigField(
        "head_dim", ("attention.key_length", "attention.value_length"), "head_dim", default=None
    ),
    # None when not stated: the whole head rotates (HF: partial_rotary_factor, in code)
    ConfigField("n_rot", "rope.dimension_count", (), default=None),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-5, 1e-6),
    ConfigField("rope_freq_base", "rope.freq_base", (), float, 10000.0),
    # HF: per family (Qwen2's sliding_window is off unless use_sliding_window)
    ConfigField("n_swa", "attention.sliding_window", (), default=0, omit_default=True),
    ConfigField("n_nextn", "nextn_predict_layers", (), default=0, omit_default=True),
    # GGUF states it by the absence of output.weight
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, False),
)

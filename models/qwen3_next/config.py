"""The Qwen3-Next config and how it is stored: the fields, their GGUF keys (llama.cpp's
``qwen3next``: the delta net's sizes under ``ssm.*``, the layer pattern as
``attention.recurrent_layers``) and ``config.json`` fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.contract.arch import metadata_key
from tessera.contract.names import REQUIRED, ConfigField
from tessera.contract.routing import ExpertRouting
from tessera.errors import ModelFileError
from tessera.models.qwen3_next.rope import (
    RopeScaling,
    rope_scaling_from_gguf,
    rope_scaling_from_hf,
)

ARCH = "qwen3next"


@attrs.frozen(kw_only=True)
class Qwen3NextConfig:
    """Hyper-parameters of one Qwen3-Next model, in GGUF terms."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int = 4096
    rms_eps: float = 1e-6
    rope_freq_base: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    #: RoPE turns the first ``n_rot`` values of each head (a quarter in Qwen3-Next).
    n_rot: int
    #: Per layer: True for a gated delta-net layer, False for gated full attention.
    recurrent: tuple[bool, ...] = attrs.field(converter=tuple)
    #: The delta net: the causal conv's width, key heads (``ssm.group_count``) of
    #: ``ssm.state_size`` values, value heads (``ssm.time_step_rank``) of ``v_head_dim``.
    conv_kernel: int
    n_k_heads: int
    k_head_dim: int
    n_v_heads: int
    v_head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    norm_topk_prob: bool = True
    tied_embeddings: bool = False

    def __attrs_post_init__(self) -> None:
        if len(self.recurrent) != self.n_layer:
            raise ModelFileError(
                f"the model lists {len(self.recurrent)} layer kinds for {self.n_layer} layers; "
                "the file is inconsistent — convert it again"
            )
        if self.n_v_heads % self.n_k_heads or self.n_head % self.n_head_kv:
            raise ModelFileError(
                "the delta net's value heads (or the attention's query heads) are no multiple "
                "of its key heads (KV heads); the file is inconsistent — convert it again"
            )

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: the delta net's Q, K and V side by side."""
        return 2 * self.key_dim + self.value_dim

    @property
    def routing(self) -> ExpertRouting:
        return ExpertRouting("softmax", self.norm_topk_prob, 1.0, 1, 1)


#: Config fields GGUF and config.json store as they are (the rest: the architecture's code).
CONFIG_FIELDS = (
    ConfigField("n_vocab", "vocab_size", "vocab_size", default=None, hf_default=REQUIRED),
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=4096),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    ConfigField("n_head_kv", "attention.head_count_kv", "num_key_value_heads"),
    ConfigField("head_dim", ("attention.key_length", "attention.value_length"), "head_dim"),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-6),
    ConfigField("conv_kernel", "ssm.conv_kernel", "linear_conv_kernel_dim"),
    ConfigField("k_head_dim", "ssm.state_size", "linear_key_head_dim"),
    ConfigField("n_k_heads", "ssm.group_count", "linear_num_key_heads"),
    ConfigField("n_v_heads", "ssm.time_step_rank", "linear_num_value_heads"),
    ConfigField("n_ff_exp", "expert_feed_forward_length", "moe_intermediate_size"),
    ConfigField(
        "n_ff_shexp", "expert_shared_feed_forward_length", "shared_expert_intermediate_size"
    ),
    ConfigField("n_expert", "expert_count", "num_experts"),
    ConfigField("n_expert_used", "expert_used_count", "num_experts_per_tok"),
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, False),
)  # fmt: skip


def config_from_gguf(
    fields: dict[str, Any], metadata: Mapping[str, Any], shapes: Mapping[str, Any]
) -> Qwen3NextConfig:
    """The config of a GGUF file, ``fields`` read by :data:`CONFIG_FIELDS` already."""
    recurrent = metadata.get(f"{ARCH}.attention.recurrent_layers")
    if recurrent is None:  # llama.cpp's fallback: every interval-th layer attends fully
        interval = int(metadata.get(f"{ARCH}.full_attention_interval", 4))
        recurrent = [(il + 1) % interval != 0 for il in range(fields["n_layer"])]
    inner = int(metadata_key(metadata, ARCH, "ssm.inner_size"))
    return Qwen3NextConfig(
        **fields | {"n_vocab": int(fields["n_vocab"] or shapes["token_embd.weight"][0])},
        rope_freq_base=float(metadata.get(f"{ARCH}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling_from_gguf(metadata, ARCH),
        n_rot=int(metadata.get(f"{ARCH}.rope.dimension_count", fields["head_dim"])),
        recurrent=tuple(bool(r) for r in recurrent),
        v_head_dim=inner // fields["n_v_heads"],
        norm_topk_prob=bool(metadata.get(f"{ARCH}.expert_weights_norm", True)),
        tied_embeddings="output.weight" not in shapes,
    )


def config_from_hf(fields: dict[str, Any], hf: Mapping[str, Any]) -> Qwen3NextConfig:
    """The config of a ``qwen3_next`` ``config.json``, ``fields`` read already."""
    step, dense = int(hf.get("decoder_sparse_step", 1)), list(hf.get("mlp_only_layers") or [])
    if step != 1 or dense or not hf.get("num_experts"):
        raise ModelFileError(
            f"this qwen3_next checkpoint has dense FFN layers (decoder_sparse_step={step}, "
            f"mlp_only_layers={dense}); tessera's qwen3next, like llama.cpp's, needs every "
            "layer to be a mixture of experts"
        )
    n_layer = fields["n_layer"]
    kinds = hf.get("layer_types") or [
        "full_attention" if (il + 1) % int(hf.get("full_attention_interval", 4)) == 0 else ""
        for il in range(n_layer)
    ]
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    return Qwen3NextConfig(
        **fields,
        rope_freq_base=theta,
        rope_scaling=rope_scaling_from_hf(rope),
        n_rot=int(fields["head_dim"] * partial),
        recurrent=tuple(kind != "full_attention" for kind in kinds),
        v_head_dim=int(hf["linear_value_head_dim"]),
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
    )

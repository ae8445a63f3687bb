"""The DeepSeek-V2/V3 config and how it is stored: the config fields, their GGUF keys
(llama.cpp's ``deepseek2``) and ``config.json`` fields, and the Hugging Face tensor names.

Head dims in GGUF are llama.cpp's: ``attention.key_length`` / ``value_length`` are those of
the cached latent (``kv_lora_rank + n_rot`` and ``kv_lora_rank``, attention as MQA), the
``_mla`` ones those of a decompressed head (``qk_nope + qk_rope`` and ``v_head_dim``).
"""

from __future__ import annotations

import attrs

from tessera.contract.names import REQUIRED, ConfigField, TensorNames
from tessera.contract.routing import GATINGS, ExpertRouting
from tessera.errors import ModelFileError


@attrs.frozen(kw_only=True)
class DeepSeek2Config:
    """Hyper-parameters of one DeepSeek-V2/V3 model, in GGUF terms."""

    n_vocab: int
    n_embd: int
    n_layer: int
    #: The dense FFN's width (the leading dense blocks).
    n_ff: int
    n_head: int
    n_ctx_train: int = 4096
    rms_eps: float = 1e-6
    #: The query's LoRA rank; 0: the query is one projection (V2-Lite).
    q_lora_rank: int = 0
    #: The compressed KV latent's width (what the cache holds, with the RoPE part).
    kv_lora_rank: int
    #: Per query head: values without RoPE, with RoPE (``rope.dimension_count``), of V.
    qk_nope_dim: int
    n_rot: int
    v_head_dim: int
    rope_freq_base: float = 10000.0
    #: YaRN: ``rope_freq_scale`` = 1 / factor (1: none), the original context, the ramp's
    #: ends and DeepSeek's ``mscale_all_dim`` (GGUF ``yarn_log_multiplier`` holds a tenth).
    rope_freq_scale: float = 1.0
    n_ctx_orig: int = 0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    mscale_all_dim: float = 0.0
    #: GGUF ``rope.scaling.attn_factor`` (1: none).
    rope_attn_factor: float = 1.0
    #: The first blocks with a dense FFN (``leading_dense_block_count``).
    n_dense_lead: int = 0
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_expert_shared: int = 0
    gating: str = attrs.field(default="softmax", validator=attrs.validators.in_(GATINGS))
    norm_topk_prob: bool = False
    expert_weights_scale: float = 1.0
    n_group: int = 1
    n_group_used: int = 1
    #: The router has a selection bias per expert (V3's ``e_score_correction_bias``).
    expert_bias: bool = False
    tied_embeddings: bool = False
    #: MTP blocks after the main ones (``nextn_predict_layers``); the main pass skips them.
    n_nextn: int = 0

    def __attrs_post_init__(self) -> None:
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(
                f"expert_used_count ({self.n_expert_used}) must be between 1 and expert_count "
                f"({self.n_expert}); the model file is inconsistent — convert it again"
            )
        if self.n_group > 1 and self.n_expert % self.n_group:
            raise ModelFileError(
                f"{self.n_expert} experts do not split into {self.n_group} groups; the model "
                "file is inconsistent — convert it again"
            )

    @property
    def head_dim_k(self) -> int:
        """A decompressed query/key head: the no-RoPE part and the RoPE part."""
        return self.qk_nope_dim + self.n_rot

    @property
    def routing(self) -> ExpertRouting:
        return ExpertRouting(
            self.gating, self.norm_topk_prob, self.expert_weights_scale, self.n_group,
            self.n_group_used,
        )  # fmt: skip

    def is_moe_layer(self, il: int) -> bool:
        return il >= self.n_dense_lead


#: Config fields GGUF and config.json store as they are (the rest: the architecture's code).
CONFIG_FIELDS = (
    ConfigField("n_vocab", "vocab_size", "vocab_size", default=None, hf_default=REQUIRED),
    ConfigField("n_ctx_train", "context_length", "max_position_embeddings", default=4096),
    ConfigField("n_embd", "embedding_length", "hidden_size"),
    ConfigField("n_layer", "block_count", "num_hidden_layers"),  # GGUF: + n_nextn
    ConfigField("n_ff", "feed_forward_length", "intermediate_size"),
    ConfigField("n_head", "attention.head_count", "num_attention_heads"),
    ConfigField("rms_eps", "attention.layer_norm_rms_epsilon", "rms_norm_eps", float, 1e-6),
    ConfigField(
        "q_lora_rank", "attention.q_lora_rank", "q_lora_rank", default=0, omit_default=True
    ),
    ConfigField("kv_lora_rank", "attention.kv_lora_rank", "kv_lora_rank"),
    ConfigField("n_rot", "rope.dimension_count", "qk_rope_head_dim"),
    ConfigField("qk_nope_dim", (), "qk_nope_head_dim"),  # GGUF: key_length_mla - n_rot
    ConfigField("v_head_dim", "attention.value_length_mla", "v_head_dim"),
    ConfigField("n_dense_lead", "leading_dense_block_count", "first_k_dense_replace", default=0),
    ConfigField("n_ff_exp", "expert_feed_forward_length", "moe_intermediate_size"),
    ConfigField("n_expert", "expert_count", ("n_routed_experts", "num_local_experts")),
    ConfigField("n_expert_used", "expert_used_count", "num_experts_per_tok"),
    ConfigField("n_expert_shared", "expert_shared_count", "n_shared_experts", default=0),
    ConfigField(
        "expert_weights_scale", "expert_weights_scale", "routed_scaling_factor", float, 1.0
    ),
    ConfigField(
        "norm_topk_prob", "expert_weights_norm", "norm_topk_prob", bool, False, omit_default=True
    ),
    ConfigField("n_group", "expert_group_count", "n_group", default=1),
    ConfigField("n_group_used", "expert_group_used_count", "topk_group", default=1),
    ConfigField("n_nextn", "nextn_predict_layers", (), default=0, omit_default=True),
    ConfigField("tied_embeddings", (), "tie_word_embeddings", bool, False),
)  # fmt: skip

HF_NAMES = TensorNames(
    global_names={
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    },
    layer_names={
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.q_a_proj.weight": "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight": "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
        "mlp.gate.weight": "ffn_gate_inp.weight",
        "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    },
    checkpoint="a DeepSeek-V2/V3",
    plugin="deepseek2 architecture",
    skip_suffixes=("rotary_emb.inv_freq",),
)

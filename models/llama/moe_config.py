"""The config of the llama family's mixture-of-experts architectures (qwen3moe, qwen2moe,
Mixtral, granitemoe, glm4moe) and what each GGUF name fixes about its experts (see
:mod:`tessera.models.llama.moe`)."""

from __future__ import annotations

from typing import Any

import attrs

from tessera.contract.names import ConfigField
from tessera.contract.routing import GATINGS, ExpertRouting
from tessera.errors import ModelFileError
from tessera.models.llama.config import LlamaConfig

#: MoE arch -> the dense llama-family arch whose attention it uses (Mixtral: ``llama``).
#: GLM-4.5's attention has no dense arch of its own: its base is itself.
BASE_ARCH = {
    "qwen3moe": "qwen3",
    "qwen2moe": "qwen2",
    "llama": "llama",
    "granitemoe": "granite",
    "glm4moe": "glm4moe",
}
#: HF ``model_type`` -> GGUF arch name.
HF_TYPES = {
    "qwen3_moe": "qwen3moe",
    "qwen2_moe": "qwen2moe",
    "mixtral": "llama",
    "granitemoe": "granitemoe",
    "glm4_moe": "glm4moe",
}
#: Whether llama.cpp renormalizes the top-k weights for the arch (files may say otherwise).
NORM_TOPK = {
    "qwen3moe": True,
    "qwen2moe": False,
    "llama": True,
    "granitemoe": True,
    "glm4moe": False,
}
#: The router's activation where a file does not say (llama.cpp's defaults).
DEFAULT_GATING = {"glm4moe": "sigmoid"}
#: The archs whose experts have the dense FFN's width: llama.cpp writes them no
#: ``expert_feed_forward_length`` (and transformers no ``moe_intermediate_size``).
EXPERTS_AS_WIDE_AS_FFN = ("llama", "granitemoe")


#: The expert fields GGUF and config.json store as they are (the rest: config_from_gguf).
CONFIG_FIELDS = (
    ConfigField(
        "n_expert", "expert_count", ("num_experts", "num_local_experts", "n_routed_experts")
    ),
    ConfigField("n_expert_used", "expert_used_count", "num_experts_per_tok"),
    ConfigField(
        "n_ff_shexp",
        "expert_shared_feed_forward_length",
        "shared_expert_intermediate_size",
        default=0,
        omit_default=True,
    ),
    # Mixtral's experts are the llama FFN's width (intermediate_size); GGUF: in code
    ConfigField("n_ff_exp", (), ("moe_intermediate_size", "intermediate_size")),
    # DeepSeek-style routing (GLM-4.5); llama.cpp reads these keys for any MoE file
    ConfigField(
        "n_dense_lead", "leading_dense_block_count", "first_k_dense_replace", default=0,
        omit_default=True,
    ),
    ConfigField(
        "expert_weights_scale", "expert_weights_scale", "routed_scaling_factor", float, 1.0,
        omit_default=True,
    ),
    ConfigField("n_group", "expert_group_count", "n_group", default=1, omit_default=True),
    ConfigField(
        "n_group_used", "expert_group_used_count", "topk_group", default=1, omit_default=True
    ),
)  # fmt: skip


@attrs.frozen(kw_only=True)
class MoEConfig(LlamaConfig):
    """A llama-family attention config (every :class:`LlamaConfig` field) plus experts."""

    arch: str = attrs.field(validator=attrs.validators.in_(tuple(BASE_ARCH)))
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    #: Rescale the chosen experts' weights to sum to one (HF ``norm_topk_prob``).
    norm_topk_prob: bool = True
    #: Hidden size of the shared expert (qwen2moe's, or GLM-4.5's ``n_expert_shared``
    #: experts of ``n_ff_exp`` as one); 0 = none.
    n_ff_shexp: int = 0
    #: qwen2moe scales its shared expert by ``sigmoid(ffn_gate_inp_shexp)``; GLM-4.5's is
    #: added as it is.
    shexp_gated: bool = True
    #: The first blocks have a dense FFN of ``n_ff`` (``leading_dense_block_count``).
    n_dense_lead: int = 0
    #: How the router chooses and weighs (see :class:`tessera.contract.routing.ExpertRouting`;
    #: ``norm_topk_prob`` is its ``normalize``).
    gating: str = attrs.field(default="softmax", validator=attrs.validators.in_(GATINGS))
    expert_weights_scale: float = 1.0
    n_group: int = 1
    n_group_used: int = 1
    #: The router has a selection bias per expert (``exp_probs_b``).
    expert_bias: bool = False

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(
                f"expert_used_count ({self.n_expert_used}) must be between 1 and expert_count "
                f"({self.n_expert}); the model file is inconsistent — convert it again"
            )

    @property
    def routing(self) -> ExpertRouting:
        return ExpertRouting(
            self.gating, self.norm_topk_prob, self.expert_weights_scale, self.n_group,
            self.n_group_used,
        )  # fmt: skip

    def is_moe_layer(self, il: int) -> bool:
        """Whether block ``il`` (an MTP block too) routes experts rather than a dense FFN."""
        return il >= self.n_dense_lead

    @classmethod
    def from_base(cls, arch: str, base: LlamaConfig, **moe: Any) -> MoEConfig:
        return cls(**(attrs.asdict(base, recurse=False) | {"arch": arch} | moe))

"""The config of the llama family's mixture-of-experts architectures (qwen3moe, qwen2moe,
Mixtral, granitemoe) and what each GGUF name fixes about its experts (see
:mod:`tessera.models.llama.moe`)."""

from __future__ import annotations

from typing import Any

import attrs

from tessera.contract.names import ConfigField
from tessera.errors import ModelFileError
from tessera.models.llama.config import LlamaConfig

#: MoE arch -> the dense llama-family arch whose attention it uses (Mixtral: ``llama``).
BASE_ARCH = {"qwen3moe": "qwen3", "qwen2moe": "qwen2", "llama": "llama", "granitemoe": "granite"}
#: HF ``model_type`` -> GGUF arch name.
HF_TYPES = {
    "qwen3_moe": "qwen3moe",
    "qwen2_moe": "qwen2moe",
    "mixtral": "llama",
    "granitemoe": "granitemoe",
}
#: Whether llama.cpp renormalizes the top-k weights for the arch (files may say otherwise).
NORM_TOPK = {"qwen3moe": True, "qwen2moe": False, "llama": True, "granitemoe": True}
#: The archs whose experts have the dense FFN's width: llama.cpp writes them no
#: ``expert_feed_forward_length`` (and transformers no ``moe_intermediate_size``).
EXPERTS_AS_WIDE_AS_FFN = ("llama", "granitemoe")


#: The expert fields GGUF and config.json store as they are (the rest: config_from_gguf).
CONFIG_FIELDS = (
    ConfigField("n_expert", "expert_count", ("num_experts", "num_local_experts")),
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
)


@attrs.frozen(kw_only=True)
class MoEConfig(LlamaConfig):
    """A llama-family attention config (every :class:`LlamaConfig` field) plus experts."""

    arch: str = attrs.field(validator=attrs.validators.in_(tuple(BASE_ARCH)))
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    #: Rescale the chosen experts' weights to sum to one (HF ``norm_topk_prob``).
    norm_topk_prob: bool = True
    #: Hidden size of the shared expert (qwen2moe); 0 = none.
    n_ff_shexp: int = 0

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelFileError(
                f"expert_used_count ({self.n_expert_used}) must be between 1 and expert_count "
                f"({self.n_expert}); the model file is inconsistent — convert it again"
            )

    @classmethod
    def from_base(cls, arch: str, base: LlamaConfig, **moe: Any) -> MoEConfig:
        return cls(**(attrs.asdict(base, recurse=False) | {"arch": arch} | moe))

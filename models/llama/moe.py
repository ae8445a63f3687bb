"""Mixture-of-experts architectures: ``qwen3moe``, ``qwen2moe`` and Mixtral (GGUF and HF),
and the base of ``granitemoe`` and ``glm4moe`` (:mod:`tessera.models.llama.granite_moe`,
:mod:`tessera.models.llama.glm4_moe`).

The attention half of each layer is the llama family's (Qwen3's QK-norm, Qwen2's Q/K/V
biases), reused from :mod:`tessera.models.llama.arch`. The FFN half is routed: a router
(``ffn_gate_inp``) scores the experts per token, softmax, the top ``expert_used_count``
are kept (renormalized to sum to one for qwen3moe, as llama.cpp does and as HF does with
``norm_topk_prob``), and the chosen experts' SwiGLU FFNs, stored stacked in
``ffn_{gate,up,down}_exps``, are summed with those weights. ``qwen2moe`` adds a shared
expert (``ffn_*_shexp``) that every token runs, scaled by ``sigmoid(ffn_gate_inp_shexp)``.

Mixtral is Llama with routed experts (renormalized top-k). llama.cpp writes it as
``general.architecture = llama`` with ``llama.expert_count``, so the llama plugin reads its
GGUF files and hands them to this code (``Architecture.variant``); its HF ``model_type`` is
``mixtral``.

The experts reach the graph through :class:`tessera.contract.experts.ModelExperts` (resident,
offloaded, cached); only the experts a ubatch selected are computed. The config and the
per-arch facts are in :mod:`tessera.models.llama.moe_config`, the forward pass in
:mod:`tessera.models.llama.moe_graph`. The routing rules llama.cpp reads for any MoE file
(``expert_gating_func``, ``expert_weights_scale``, expert groups, a selection bias
``exp_probs_b``, leading dense blocks) are read here for every member.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from tessera.contract.arch import metadata_key
from tessera.contract.experts import ExpertLayout, ExpertTensors, ModelExperts, checked_experts
from tessera.contract.names import fields_from_gguf, fields_from_hf, fields_to_gguf
from tessera.contract.routing import GATING_IDS
from tessera.errors import ModelFileError
from tessera.hookspecs import hookimpl
from tessera.models.llama.arch import LlamaArchitecture
from tessera.models.llama.config import LlamaConfig
from tessera.models.llama.moe_config import (
    BASE_ARCH,
    CONFIG_FIELDS,
    DEFAULT_GATING,
    EXPERTS_AS_WIDE_AS_FFN,
    HF_TYPES,
    NORM_TOPK,
    MoEConfig,
)
from tessera.models.llama.moe_graph import MoEGraph
from tessera.models.llama.moe_hf import HF_NAMES, Subset, qwen_moe_name, stacked_experts

TESSERA_PLUGIN_API = 2
_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
_MOE_ONLY_FIELDS = {f.name for f in attrs.fields(MoEConfig)} - {
    f.name for f in attrs.fields(LlamaConfig)
}


class MoEArchitecture(LlamaArchitecture):
    names = ("qwen3moe", "qwen2moe")  # GGUF "llama" (Mixtral) comes through the llama plugin
    # granitemoe and glm4_moe: their own plugins (HF_TYPES names every member's arch)
    hf_model_types = ("qwen3_moe", "qwen2_moe", "mixtral")
    hf_names = HF_NAMES

    def variant(self, config: MoEConfig) -> MoEArchitecture:
        return MixtralArchitecture() if config.arch == "llama" else self

    def config_from_gguf(
        self, metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]]
    ) -> MoEConfig:
        arch = metadata["general.architecture"]
        base, prefix = BASE_ARCH[arch], f"{arch}."
        # Mixtral's experts have the llama FFN size (llama.cpp writes no expert length).
        wide = arch in EXPERTS_AS_WIDE_AS_FFN
        dense_ff = metadata.get(f"{arch}.feed_forward_length") if wide else None
        n_ff_exp = int(metadata_key(metadata, arch, "expert_feed_forward_length", dense_ff))
        # The dense half reads the same keys under the base arch's prefix (expert keys left
        # out: the llama plugin would hand a file with experts back to this one).
        renamed = {
            (base + k[len(arch) :] if k.startswith(prefix) else k): v
            for k, v in metadata.items()
            if not k.startswith(f"{arch}.expert_")
        }
        renamed["general.architecture"] = base
        renamed.setdefault(f"{base}.feed_forward_length", n_ff_exp)
        return MoEConfig.from_base(
            arch,
            super().config_from_gguf(renamed, tensor_shapes),
            **fields_from_gguf(CONFIG_FIELDS, metadata, arch),
            n_ff_exp=n_ff_exp,
            # llama.cpp renormalizes for qwen3moe and Mixtral, not qwen2moe; a file may say.
            norm_topk_prob=bool(
                metadata_key(metadata, arch, "expert_weights_norm", NORM_TOPK[arch])
            ),
            gating=GATING_IDS.get(
                int(metadata.get(f"{arch}.expert_gating_func", 0)),
                DEFAULT_GATING.get(arch, "softmax"),
            ),
            expert_bias=any(n.endswith("exp_probs_b.bias") for n in tensor_shapes),
        )

    def config_from_hf(self, hf: Mapping[str, Any]) -> MoEConfig:
        arch = HF_TYPES[hf["model_type"]]
        step = int(hf.get("decoder_sparse_step", 1))
        dense = list(hf.get("mlp_only_layers") or [])
        if step != 1 or dense:
            raise ModelFileError(
                f"this {hf['model_type']} checkpoint has dense FFN layers (decoder_sparse_step="
                f"{step}, mlp_only_layers={dense}); the {arch} plugin, like llama.cpp, needs "
                "every layer to be a mixture of experts"
            )
        return MoEConfig.from_base(
            arch,
            super().config_from_hf(dict(hf) | {"model_type": BASE_ARCH[arch]}),
            **fields_from_hf(CONFIG_FIELDS, hf),
            # Mixtral and Granite always renormalize the top-k
            norm_topk_prob=bool(hf.get("norm_topk_prob", arch in ("llama", "granitemoe"))),
        )

    def gguf_metadata(self, c: MoEConfig) -> dict[str, Any]:
        a = c.arch
        meta = super().gguf_metadata(c) | fields_to_gguf(CONFIG_FIELDS, c, a)
        if a not in EXPERTS_AS_WIDE_AS_FFN:  # else feed_forward_length, as llama.cpp has it
            meta[f"{a}.expert_feed_forward_length"] = c.n_ff_exp
        if c.norm_topk_prob != NORM_TOPK[a]:
            # Not llama.cpp's default for this arch: say so (llama.cpp ignores the key).
            meta[f"{a}.expert_weights_norm"] = c.norm_topk_prob
        if c.gating != "softmax":
            meta[f"{a}.expert_gating_func"] = next(
                i for i, g in GATING_IDS.items() if g == c.gating
            )
        return meta

    def tensor_shapes(self, c: MoEConfig) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name, shape in super().tensor_shapes(c).items():
            layer, _, rest = name.removeprefix("blk.").partition(".")
            dense_ffn = rest in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
            if name.startswith("blk.") and dense_ffn and c.is_moe_layer(int(layer)):
                if rest == "ffn_down.weight":  # the last of the three: the experts follow
                    shapes |= _moe_shapes(c, f"blk.{layer}.")
                continue
            shapes[name] = shape
        return shapes

    def tensors_from_hf(
        self, c: MoEConfig, hf_tensors: Mapping[str, Any], for_gguf: bool
    ) -> Iterator[tuple[str, Any]]:
        mapped, experts = {}, {}
        for hf_name in hf_tensors:
            layer, _, rest = hf_name.removeprefix("model.layers.").partition(".")
            rest = qwen_moe_name(rest)
            if hf_name.startswith("model.layers.") and rest.startswith("mlp.experts."):
                experts.setdefault(int(layer), {})[rest] = hf_name
                continue
            mapped[hf_name] = hf_name
        yield from super().tensors_from_hf(c, Subset(hf_tensors, mapped), for_gguf)
        for layer, names in sorted(experts.items()):
            yield from stacked_experts(c, layer, names, hf_tensors)

    def example_config(self, **overrides: Any) -> MoEConfig:
        arch = overrides.pop("arch", "qwen3moe")
        moe = {
            "n_expert": overrides.pop("n_expert", 8),
            "n_expert_used": overrides.pop("n_expert_used", 2),
            "n_ff_exp": overrides.pop("n_ff_exp", 32),
            "norm_topk_prob": overrides.pop("norm_topk_prob", NORM_TOPK[arch]),
            "n_ff_shexp": overrides.pop("n_ff_shexp", 48 if arch == "qwen2moe" else 0),
        }
        # the routing fields (and any other of MoEConfig's own) go to the MoE config
        moe |= {k: overrides.pop(k) for k in list(overrides) if k in _MOE_ONLY_FIELDS}
        if arch in EXPERTS_AS_WIDE_AS_FFN:  # Mixtral: the experts are the llama FFN's width
            overrides["n_ff"] = moe["n_ff_exp"]
        base = super().example_config(arch=BASE_ARCH[arch], **overrides)
        return MoEConfig.from_base(arch, base, **moe)

    def required_ops(self, c: MoEConfig) -> list[tuple[str, dict[str, Any]]]:
        return [*super().required_ops(c), ("mul", {})]

    def expert_layout(self, c: MoEConfig) -> ExpertLayout:
        """Every MoE block's experts, the MTP blocks' included."""
        return ExpertLayout(
            c.n_expert,
            c.n_expert_used,
            tuple(
                ExpertTensors(il, *(f"blk.{il}.{n}.weight" for n in _EXPERTS))
                for il in range(c.n_layer + c.n_nextn)
                if c.is_moe_layer(il)
            ),
        )

    def build(
        self,
        c: MoEConfig,
        weights: Mapping[str, Any],
        backend: Any,
        experts: ModelExperts | None = None,
    ) -> MoEGraph:
        """``experts`` comes from the loader; without it the stacked tensors in ``weights``
        are used as they are (every expert resident)."""
        experts = checked_experts(
            c.arch, self.expert_layout(c), self.tensor_shapes(c), weights, experts
        )
        return MoEGraph(c, weights, backend, experts)


class MixtralArchitecture(MoEArchitecture):
    """What runs a Mixtral model: the MoE code under the name llama.cpp gives it. Reached
    through ``variant`` (the GGUF name ``llama`` belongs to the llama plugin), never
    registered itself."""

    names = ("llama",)
    hf_model_types = ("mixtral",)

    def variant(self, config: MoEConfig) -> MoEArchitecture:
        return self


@hookimpl
def tessera_register_architectures(register):
    register(MoEArchitecture())


def _moe_shapes(c: MoEConfig, p: str) -> dict[str, tuple[int, ...]]:
    """The router, the stacked experts and the shared expert of one MoE block."""
    e, f, d = c.n_expert, c.n_ff_exp, c.n_embd
    shapes = {
        p + "ffn_gate_inp.weight": (e, d),
        p + "ffn_gate_exps.weight": (e, f, d),
        p + "ffn_up_exps.weight": (e, f, d),
        p + "ffn_down_exps.weight": (e, d, f),
    }
    if c.expert_bias:
        shapes[p + "exp_probs_b.bias"] = (e,)
    if c.n_ff_shexp:
        if c.shexp_gated:
            shapes[p + "ffn_gate_inp_shexp.weight"] = (d,)
        shapes[p + "ffn_gate_shexp.weight"] = (c.n_ff_shexp, d)
        shapes[p + "ffn_up_shexp.weight"] = (c.n_ff_shexp, d)
        shapes[p + "ffn_down_shexp.weight"] = (d, c.n_ff_shexp)
    return shapes

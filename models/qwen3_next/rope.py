"""Qwen3-Next's RoPE scaling: none, linear or YaRN (how its checkpoints reach past 256K),
as llama.cpp's ``rope.scaling.*`` keys and transformers' ``rope_parameters`` state it.

Linear divides every pair's speed by ``factor``. YaRN blends, per pair, the original speed
(short wavelengths) with the speed divided by ``factor`` (long ones) between the dims that
make ``beta_fast`` and ``beta_slow`` turns over the original context, and scales cos and
sin by ``0.1 ln(factor) + 1`` (:mod:`tessera.contract.yarn`, ggml's computation, which is
transformers' with its default ``truncate``). Both act on the ``n_rot`` rotated values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.rope import RopeArgs
from tessera.contract.yarn import yarn_divisors, yarn_mscale
from tessera.errors import ModelFileError

KINDS = ("none", "linear", "yarn")


@attrs.frozen
class RopeScaling:
    """How RoPE is stretched: ``kind`` (none, linear, yarn), by ``factor``, over an
    original context of ``n_ctx_orig`` (YaRN)."""

    kind: str = "none"
    factor: float = 1.0
    n_ctx_orig: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0


def rope_scaling_from_gguf(metadata: Mapping[str, Any], arch: str) -> RopeScaling:
    """llama.cpp's ``{arch}.rope.scaling.*`` keys (absent: no scaling)."""

    def key(name: str, default: Any) -> Any:
        return metadata.get(f"{arch}.rope.scaling.{name}", default)

    kind = str(key("type", "none"))
    if kind not in KINDS:
        raise ModelFileError(
            f"this {arch} file scales RoPE with '{kind}'; tessera's {arch} runs none, linear "
            "or yarn; convert a checkpoint with one of those"
        )
    if kind != "none":
        unsupported = [k for k in ("attn_factor", "yarn_ext_factor") if key(k, None) is not None]
        if unsupported:
            raise ModelFileError(
                f"this {arch} file sets rope.scaling.{unsupported[0]}, which tessera's {arch} "
                "does not apply; convert the checkpoint without it"
            )
    if kind == "none":
        return RopeScaling()
    return RopeScaling(
        kind,
        float(key("factor", 1.0)),
        int(key("original_context_length", 0)),
        float(key("yarn_beta_fast", 32.0)),
        float(key("yarn_beta_slow", 1.0)),
    )


def rope_scaling_from_hf(rope: Mapping[str, Any]) -> RopeScaling:
    """transformers' ``rope_parameters`` of a ``qwen3_next`` config."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    if kind == "linear":
        return RopeScaling("linear", float(rope["factor"]))
    if kind != "yarn":
        raise ModelFileError(
            f"this qwen3_next checkpoint scales RoPE with '{kind}'; tessera's qwen3next runs "
            "default, linear or yarn RoPE"
        )
    odd = [k for k in ("attention_factor", "mscale", "mscale_all_dim") if rope.get(k)]
    if odd or rope.get("truncate", True) is False:
        raise ModelFileError(
            f"this qwen3_next checkpoint's YaRN sets {(odd or ['truncate'])[0]}, which "
            "llama.cpp's GGUF keys for qwen3next (and so tessera) cannot state; remove it from "
            "rope_parameters"
        )
    return RopeScaling(
        "yarn",
        float(rope["factor"]),
        int(rope["original_max_position_embeddings"]),
        float(rope.get("beta_fast") or 32.0),
        float(rope.get("beta_slow") or 1.0),
    )


def rope_scaling_to_gguf(rs: RopeScaling, arch: str) -> dict[str, Any]:
    """The ``rope.scaling.*`` keys llama.cpp's converter writes for ``rs``."""
    if rs.kind == "none":
        return {}
    p = f"{arch}.rope.scaling."
    meta: dict[str, Any] = {p + "type": rs.kind, p + "factor": rs.factor}
    if rs.kind == "yarn":
        meta[p + "original_context_length"] = rs.n_ctx_orig
        if rs.beta_fast != 32.0:  # as llama.cpp's converter, only what the checkpoint says
            meta[p + "yarn_beta_fast"] = rs.beta_fast
        if rs.beta_slow != 1.0:
            meta[p + "yarn_beta_slow"] = rs.beta_slow
    return meta


def rotation(n_rot: int, freq_base: float, rs: RopeScaling) -> RopeArgs:
    """The rotation of a model with ``n_rot`` rotated values, base ``freq_base``, ``rs``."""
    if rs.kind == "linear":
        return RopeArgs(n_rot, freq_base, 1.0 / rs.factor)
    if rs.kind == "yarn":
        blend = yarn_divisors(
            n_rot, freq_base, 1.0 / rs.factor, rs.n_ctx_orig, rs.beta_fast, rs.beta_slow
        )
        mscale = yarn_mscale(rs.factor)
        return RopeArgs(n_rot, freq_base, 1.0, True, blend.astype(np.float32), mscale)
    return RopeArgs(n_rot, freq_base)

"""How a mixture-of-experts router's logits choose experts and weigh them, as llama.cpp's
``build_moe_ffn`` does for every MoE architecture.

Per token: the logits become probabilities (softmax over all experts, or a sigmoid per
expert); a selection bias may shift which experts are chosen without changing their
weights (DeepSeek-V3's ``e_score_correction_bias``, GGUF ``exp_probs_b``); with expert
groups only the best ``n_group_used`` groups (each scored by the sum of its two best
experts) are eligible; the top ``k`` are kept; their probabilities are optionally
renormalized to sum to one and then scaled (DeepSeek's ``routed_scaling_factor``).
"""

from __future__ import annotations

import attrs
import numpy as np

GATINGS = ("softmax", "sigmoid")
#: llama.cpp's ``expert_gating_func`` values (GGUF ``{arch}.expert_gating_func``).
GATING_IDS = {1: "softmax", 2: "sigmoid"}
#: llama.cpp clamps the sum of the chosen weights before renormalizing (the smallest
#: normal float16), so a row of near-zero sigmoid weights does not divide by zero.
MIN_WEIGHT_SUM = 6.103515625e-5


@attrs.frozen
class ExpertRouting:
    """A router's rules (GGUF keys of llama.cpp in brackets)."""

    #: ``expert_gating_func``: softmax over the experts or a sigmoid per expert.
    gating: str = attrs.field(default="softmax", validator=attrs.validators.in_(GATINGS))
    #: ``expert_weights_norm``: the chosen weights are rescaled to sum to one.
    normalize: bool = False
    #: ``expert_weights_scale``: the chosen weights are multiplied by it (1: unscaled).
    scale: float = 1.0
    #: ``expert_group_count`` / ``expert_group_used_count``: with more than one group,
    #: only the experts of the best ``n_group_used`` groups can be chosen.
    n_group: int = 1
    n_group_used: int = 1


def route_experts(
    logits: np.ndarray, k: int, routing: ExpertRouting, bias: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Expert ids ``(T, k)`` int32 and their weights ``(T, k)`` float32 from router logits
    ``(T, n_expert)``; ``bias`` ``(n_expert,)`` shifts the choice only."""
    logits = np.asarray(logits, dtype=np.float32)
    if routing.gating == "softmax":
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
    else:
        probs = 1.0 / (1.0 + np.exp(-logits))
    choice = probs if bias is None else probs + np.asarray(bias, dtype=np.float32)
    if routing.n_group > 1:
        choice = _best_groups_only(choice, routing.n_group, routing.n_group_used)
    ids = np.argsort(-choice, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if routing.normalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
    if routing.scale not in (0.0, 1.0):  # llama.cpp reads 0 as "not set"
        weights = weights * np.float32(routing.scale)
    return ids.astype(np.int32), weights.astype(np.float32)


def _best_groups_only(choice: np.ndarray, n_group: int, n_used: int) -> np.ndarray:
    """``choice`` with the experts outside each row's ``n_used`` best groups at -inf; a
    group's score is the sum of its two best experts (DeepSeek-V3's ``noaux_tc``)."""
    n_tokens, n_expert = choice.shape
    groups = choice.reshape(n_tokens, n_group, n_expert // n_group)
    score = np.sort(groups, axis=-1)[..., -2:].sum(axis=-1)
    best = np.argsort(-score, axis=-1, kind="stable")[:, :n_used]
    keep = np.zeros((n_tokens, n_group), dtype=bool)
    np.put_along_axis(keep, best, True, axis=-1)
    return np.where(keep[:, :, None], groups, -np.inf).reshape(n_tokens, n_expert)

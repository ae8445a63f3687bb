"""Expert routing against transformers' own routers, run on the same random router logits:
DeepSeek-V3's and GLM-4.5's (sigmoid, selection bias, groups scored by their two best
experts, renormalized top-k, ``routed_scaling_factor``) and DeepSeek-V2's greedy one
(softmax, top-k as it is, scaled). The routers take hidden states, so each gets an
identity weight and the logits as its input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter

from tessera.contract.routing import ExpertRouting, route_experts

N_TOKENS, N_EXPERT = 33, 12


def transformers_route(router_class, model_type, logits, bias=None, **config):
    """transformers' chosen experts (sorted per row) and their weights."""
    dims = {"hidden_size": N_EXPERT, "num_attention_heads": 4, "num_key_value_heads": 4}
    c = AutoConfig.for_model(model_type, n_routed_experts=N_EXPERT, **dims, **config)
    router = router_class(c)
    with torch.no_grad():
        router.weight.copy_(torch.eye(N_EXPERT))
        if bias is not None:
            router.e_score_correction_bias.copy_(torch.from_numpy(bias))
        _, weights, ids = router(torch.from_numpy(logits))
    return _sorted(ids.numpy(), weights.numpy())


def _sorted(ids, weights):
    order = np.argsort(ids, axis=-1)
    return np.take_along_axis(ids, order, -1), np.take_along_axis(weights, order, -1)


@pytest.fixture
def logits():
    return np.random.default_rng(0).normal(0, 1.5, (N_TOKENS, N_EXPERT)).astype(np.float32)


@pytest.mark.parametrize(
    ("router_class", "model_type"),
    [(DeepseekV3TopkRouter, "deepseek_v3"), (Glm4MoeTopkRouter, "glm4_moe")],
)
@pytest.mark.parametrize(("n_group", "topk_group", "k"), [(4, 2, 3), (3, 1, 2), (1, 1, 4)])
def test_biased_sigmoid_routing_in_groups_matches_transformers(
    logits, router_class, model_type, n_group, topk_group, k
):
    bias = np.random.default_rng(1).normal(0, 0.3, N_EXPERT).astype(np.float32)
    want = transformers_route(
        router_class, model_type, logits, bias, n_group=n_group, topk_group=topk_group,
        num_experts_per_tok=k, norm_topk_prob=True, routed_scaling_factor=2.5,
    )  # fmt: skip
    rules = ExpertRouting("sigmoid", True, 2.5, n_group, topk_group)
    ids, weights = _sorted(*route_experts(logits, k, rules, bias))
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_allclose(weights, want[1], rtol=1e-6)


def test_the_bias_and_the_groups_decide_which_experts_are_chosen(logits):
    """The cases above are not vacuous: without the bias or the groups, other experts win."""
    bias = np.random.default_rng(1).normal(0, 0.3, N_EXPERT).astype(np.float32)
    rules = ExpertRouting("sigmoid", True, 2.5, 4, 2)
    chosen = _sorted(*route_experts(logits, 3, rules, bias))[0]
    assert not np.array_equal(chosen, _sorted(*route_experts(logits, 3, rules))[0])
    ungrouped = ExpertRouting("sigmoid", True, 2.5)
    assert not np.array_equal(chosen, _sorted(*route_experts(logits, 3, ungrouped, bias))[0])


def test_greedy_softmax_routing_matches_deepseek_v2(logits):
    want = transformers_route(
        DeepseekV2TopkRouter, "deepseek_v2", logits, num_experts_per_tok=3,
        topk_method="greedy", routed_scaling_factor=1.5,
    )  # fmt: skip
    ids, weights = _sorted(*route_experts(logits, 3, ExpertRouting("softmax", False, 1.5)))
    np.testing.assert_array_equal(ids, want[0])
    np.testing.assert_allclose(weights, want[1], rtol=1e-6)


def test_renormalizing_clamps_the_sum_as_llama_cpp_does():
    """Sigmoid weights all near zero: llama.cpp divides by at least 2**-14, not by ~0."""
    logits = np.full((1, 4), -30.0, dtype=np.float32)
    _, weights = route_experts(logits, 2, ExpertRouting("sigmoid", True))
    np.testing.assert_allclose(weights, 1.0 / (1.0 + np.exp(30.0)) / 6.103515625e-5, rtol=1e-5)

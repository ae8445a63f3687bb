"""The bundled trained MoE model (``tessera-moe.gguf``): an independent reader agrees, the
experts are all in use, and offloading them behind the cache changes no token.

The oracle is transformers reading the same GGUF file (``gguf_file=``, its own Q8_0
decoder). Its GGUF config mapping for ``qwen3moe`` does not read
``expert_feed_forward_length`` and leaves ``norm_topk_prob`` off, so those two facts
(which llama.cpp takes from the key and always applies) are set on its config.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tessera.contract.experts import MoEOptions
from tessera.contract.routing import route_experts
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
PATH = default_model_path().with_name("tessera-moe.gguf")
TEXT = "The for statement is used to iterate over the elements of a sequence, such as a list"


@pytest.fixture(scope="module")
def model():
    return load_model(PATH, RUNTIME, "numpy")


def test_the_bundled_file_is_a_top2_of_8_qwen3moe_made_of_experts(model):
    c = model.config
    assert (c.arch, c.n_expert, c.n_expert_used, c.norm_topk_prob) == ("qwen3moe", 8, 2, True)
    assert PATH.stat().st_size < 16 * 2**20  # shipped in the repository: keep it small
    # as in real MoE models, expert weights are most of the parameters (what makes an
    # offloaded expert's miss dominate a decode step, and the expert cache worth having)
    sizes = {name: raw.n_elements for name, raw in read_gguf(PATH).tensors.items()}
    experts = sum(n for name, n in sizes.items() if "_exps." in name)
    assert experts / sum(sizes.values()) >= 0.85


def test_logits_match_transformers_reading_the_same_gguf(model):
    config = transformers.AutoConfig.from_pretrained(PATH.parent, gguf_file=PATH.name)
    config.moe_intermediate_size = model.config.n_ff_exp
    config.norm_topk_prob = True
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        Path(PATH.parent), gguf_file=PATH.name, config=config, dtype=torch.float32
    )
    ids = model.tokenizer.encode(TEXT)
    with torch.no_grad():
        want = hf(torch.tensor(ids)[None]).logits[0].numpy()
    got = Context(model, ContextParams(n_ctx=64)).decode(Batch.for_sequence(ids, logits="all"))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_trained_router_spreads_tokens_and_has_locality(model, monkeypatch):
    """What an expert cache lives on: consecutive tokens share experts more often than
    chance (1 - C(6,2)/C(8,2) = 0.46 for top-2 of 8), while no layer collapses onto a few."""
    from pydoc_data.topics import topics

    import tessera.models.llama.moe_graph as moe_graph

    routed: list[np.ndarray] = []

    def recording(logits, k, *rest):
        ids, weights = route_experts(logits, k, *rest)
        routed.append(ids)
        return ids, weights

    monkeypatch.setattr(moe_graph, "route_experts", recording)
    ids = model.tokenizer.encode(topics["for"] + topics["while"])[:400]
    Context(model, ContextParams(n_ctx=512)).decode(Batch.for_sequence(ids, logits="all"))
    assert len(routed) == model.config.n_layer
    for layer in routed:
        assert len(np.unique(layer)) >= 5
        shared = [bool(set(layer[t]) & set(layer[t - 1])) for t in range(1, len(layer))]
        assert np.mean(shared) > 0.52


def test_offloaded_cached_experts_give_the_same_greedy_text(model):
    def greedy(m):
        ctx = Context(m, ContextParams(n_ctx=128))
        prompt = m.tokenizer.encode("The for statement")
        return list(generate(ctx, prompt, 24, Sampler(SamplerParams(temperature=0))))

    slow = load_model(PATH, RUNTIME, "numpy", moe=MoEOptions(cpu_moe=True)).experts
    half_mib = sum(s.n_expert * s.expert_nbytes() for s in slow.slow_layers()) / 2 / 2**20
    cached = load_model(PATH, RUNTIME, "numpy", moe=MoEOptions(cpu_moe=True, cache_mib=half_mib))
    assert greedy(cached) == greedy(model)
    stats = cached.experts.cache.stats()
    assert stats["hits"] > stats["misses"] > 0  # a trained router reuses experts
    assert stats["bytes_used"] <= stats["budget_bytes"]


def test_quantized_experts_load_like_2d_weights_of_their_type(model):
    """On the torch CPU backend each expert is its slice of the file's Q8_0 bytes under the
    type's kernel (no dense copy), recorded once per layer; the logits are numpy's."""
    fast = load_model(PATH, RUNTIME, "torch")
    gate, up, down = fast.experts.layer(0).get([3])[0]
    assert not any(isinstance(w, torch.Tensor) for w in (gate, up, down))
    records = [r for r in fast.backend.placements if r[0].endswith(" experts")]
    assert len(records) == model.config.n_layer and "kernel Q8_0" in records[0][1]
    assert not any("_exps.weight[" in r[0] for r in fast.backend.placements)
    ids = model.tokenizer.encode(TEXT)
    want = Context(model, ContextParams(n_ctx=64)).decode(Batch.for_sequence(ids, logits="all"))
    got = Context(fast, ContextParams(n_ctx=64)).decode(Batch.for_sequence(ids, logits="all"))
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()

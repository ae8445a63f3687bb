"""DeepSeek-V2-Lite and DeepSeek-V3 shapes against transformers on committed random-weight
checkpoints (``tests/models/deepseek2_fixtures.py`` says what each has).

tessera loads each from its HF folder, from llama.cpp's GGUF and from ``tessera convert``'s,
on numpy and torch in f32, and must reproduce transformers' logits for every prompt row
(relative error <= 1e-5; measured <= 5e-7) and its greedy continuation through the KV
cache. The 12-token prompt is past YaRN's original context of 8. The cache holds what
llama.cpp's holds for MLA: one row of latent and RoPE key per token and layer, V read from
it; transformers decompresses per head, so agreeing with it checks the absorbed attention.
``tessera convert`` writes what llama.cpp's converter writes: kv_b_proj split into attn_k_b /
attn_v_b, the MLA head dims, YaRN's log multiplier (a tenth of mscale_all_dim) and the
router's keys.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers
from deepseek2_fixtures import FIXTURES
from llama_like import (
    BACKENDS,
    RUNTIME,
    family_parity,
    load,
    prompt_of,
)

from tessera.cli.main import main
from tessera.contract.routing import ExpertRouting, route_experts
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.memory import kv_cache_bytes
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import ModelFileError
from tessera.files.gguf import read_gguf
from tessera.testing.pytest_plugin import architecture_conformance
from tessera.text.chat_template import ChatTemplate
from tessera.text.tokenizer import Tokenizer

TOL = 1e-5
ARCH = RUNTIME.architecture("deepseek2")


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, list(FIXTURES), TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prompt_prefilled_in_ubatches_of_5_reads_the_latent_cache_across_them(family, backend):
    prompt, _, greedy = family.expected("llama.cpp")
    ctx = Context(load(family.f.gguf, backend), ContextParams(n_ctx=64, n_ubatch=5))
    sampler = Sampler(SamplerParams(temperature=0))
    assert list(generate(ctx, prompt.tolist(), len(greedy), sampler)) == greedy


@pytest.mark.parametrize("source", ["hf", "llama.cpp"])
def test_each_source_reads_the_shape_of_its_model(source):
    lite, v3 = (load(FIXTURES[n].hf_dir if source == "hf" else FIXTURES[n].gguf, "numpy").config
                for n in FIXTURES)  # fmt: skip
    assert (lite.q_lora_rank, v3.q_lora_rank) == (0, 24)
    assert (lite.gating, lite.expert_bias, lite.norm_topk_prob) == ("softmax", False, False)
    assert (v3.gating, v3.expert_bias, v3.norm_topk_prob) == ("sigmoid", True, True)
    assert (v3.n_group, v3.n_group_used, v3.n_expert_shared) == (4, 2, 1)
    assert v3.expert_weights_scale == pytest.approx(2.5)
    assert lite.mscale_all_dim == pytest.approx(0.707) and v3.mscale_all_dim == pytest.approx(1)
    for c in (lite, v3):
        assert (c.n_dense_lead, c.kv_lora_rank, c.qk_nope_dim, c.n_rot, c.v_head_dim) == (
            1, 32, 16, 8, 16,
        )  # fmt: skip
        assert (c.rope_freq_scale, c.n_ctx_orig) == (0.25, 8) and len(prompt_of()) > 8


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_cache_holds_the_latent_and_the_rope_key_once(backend):
    model = load(FIXTURES["deepseek-v3"].gguf, backend)
    c = model.config
    ctx = Context(model, ContextParams(n_ctx=32))
    ctx.decode(Batch.for_sequence(prompt_of(), logits="last"))
    for k, v in zip(ctx.kv.k, ctx.kv.v, strict=True):
        assert tuple(k.shape) == (32, 1, c.kv_lora_rank + c.n_rot)
        assert tuple(v.shape) == (32, 1, c.kv_lora_rank)
        np.testing.assert_array_equal(
            model.backend.to_numpy(v), model.backend.to_numpy(k)[..., :32]
        )
    k0 = model.backend.to_numpy(ctx.kv.k[0])
    assert np.abs(k0[: len(prompt_of())]).max() > 0 and not k0[len(prompt_of()) :].any()
    per_token = c.n_layer * (c.kv_lora_rank + c.n_rot) * 4
    assert kv_cache_bytes(ARCH.kv_layout(c), 32, "f32") == 32 * per_token


def test_v3s_router_bias_and_groups_change_which_experts_run():
    model = load(FIXTURES["deepseek-v3"].gguf, "numpy")
    c, graph = model.config, model.graph
    seen, ffn = [], graph._ffn

    def spy(il, h):
        if c.is_moe_layer(il):
            w = model.weights[f"blk.{il}.ffn_gate_inp.weight"]
            seen.append(model.backend.to_numpy(model.backend.matmul(h, w)))
        return ffn(il, h)

    graph._ffn = spy
    Context(model, ContextParams(n_ctx=32)).decode(Batch.for_sequence(prompt_of(), logits="all"))
    bias = graph._bias[1]
    chosen = route_experts(seen[0], c.n_expert_used, c.routing, bias)[0]
    unbiased = route_experts(seen[0], c.n_expert_used, c.routing)[0]
    ungrouped_rules = ExpertRouting(c.gating, c.norm_topk_prob, c.expert_weights_scale)
    ungrouped = route_experts(seen[0], c.n_expert_used, ungrouped_rules, bias)[0]
    assert not np.array_equal(np.sort(chosen), np.sort(unbiased))
    assert not np.array_equal(np.sort(chosen), np.sort(ungrouped))


def test_a_v3_checkpoints_mtp_layers_are_left_out():
    f = FIXTURES["deepseek-v3"]
    c = ARCH.config_from_hf(json.loads((f.hf_dir / "config.json").read_text()))
    extra = {f"model.layers.{c.n_layer}.enorm.weight": np.ones(64, np.float32)}
    tensors = {"model.norm.weight": np.ones(64, np.float32)} | extra
    assert [n for n, _ in ARCH.tensors_from_hf(c, tensors, for_gguf=True)] == ["output_norm.weight"]


def test_yarn_that_llama_cpp_would_scale_otherwise_is_refused():
    f = FIXTURES["deepseek-v2-lite"]
    hf = json.loads((f.hf_dir / "config.json").read_text())
    hf["rope_parameters"] = dict(hf["rope_parameters"], mscale=1.0)  # != mscale_all_dim
    with pytest.raises(ModelFileError, match="mscale_all_dim"):
        ARCH.config_from_hf(hf)


@pytest.mark.parametrize("name", FIXTURES)
def test_the_gguf_chat_template_renders_as_transformers_renders_it(name):
    f = FIXTURES[name]
    tok = Tokenizer.from_gguf_metadata(read_gguf(f.gguf).metadata)
    ours = ChatTemplate(
        tok.chat_template, tok.token_to_piece(tok.bos_id), tok.token_to_piece(tok.eos_id)
    )
    hf = transformers.AutoTokenizer.from_pretrained(f.hf_dir)
    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is."},
        {"role": "user", "content": "And of Italy?"},
    ]
    for convo, prompt in ((messages, True), (messages[:3], False)):
        want = hf.apply_chat_template(convo, tokenize=False, add_generation_prompt=prompt)
        assert ours.render(convo, add_generation_prompt=prompt) == want
        assert convo[1]["content"] in want


def test_tessera_plugins_lists_the_architecture(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "arch-deepseek2 (tessera.models.deepseek2.arch;" in out
    listed = out.split("architectures: ")[1].split("\n")[0].split(", ")
    assert {"deepseek2"} <= set(listed)


test_deepseek2_conformance = architecture_conformance("deepseek2", runtime=RUNTIME)
test_deepseek2_conformance_torch = architecture_conformance(
    "deepseek2", backend="torch", dtype="f32", runtime=RUNTIME
)

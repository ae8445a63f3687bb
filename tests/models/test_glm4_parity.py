"""GLM-4-0414 and GLM-4.5 against transformers on committed random-weight checkpoints.

``glm4``: four norms a block (before and after attention and the FFN), fused gate/up rows,
Q/K/V biases and RoPE on half of each head in adjacent pairs (transformers' own layout,
which llama.cpp's converter keeps). ``glm4moe``: a dense first block, then DeepSeek-style
experts: a sigmoid router with its selection bias over 6 experts in 2 groups (only the
best group's experts eligible), top-2 renormalized and scaled by 2.5, one shared expert;
Q/K norms per head, NeoX RoPE on half of each head, and an MTP block after the main ones
that the main pass must not run. tessera loads each from its HF folder, from llama.cpp's
GGUF and from ``tessera convert``'s, on numpy and torch in f32, and must reproduce
transformers' logits for every prompt row (relative error <= 1e-5; measured <= 5e-7) and
its greedy continuation through the KV cache.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from llama_like import (
    FIXTURES,
    RUNTIME,
    family_parity,
    load,
    prompt_of,
)
from safetensors.numpy import load_file, save_file

from tessera.cli.main import main
from tessera.contract.routing import ExpertRouting, route_experts
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import read_gguf
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.pytest_plugin import architecture_conformance

TOL = 1e-5


(
    family,
    test_logits_and_greedy_tokens_match_transformers,
    test_tessera_writes_what_llama_cpp_writes,
) = family_parity(FIXTURES, ["glm4", "glm4moe"], TOL)


@pytest.mark.parametrize("source", ["hf", "llama.cpp"])
def test_each_source_reads_the_blocks_glm_has(source):
    dense = load(FIXTURES["glm4"].hf_dir if source == "hf" else FIXTURES["glm4"].gguf, "numpy")
    c = dense.config
    assert (c.n_rot, c.head_dim, c.rope_neox) == (8, 16, False)  # half a head, adjacent pairs
    assert c.pre_norms and c.post_norms and c.fused_gate_up and c.attn_bias
    f = FIXTURES["glm4moe"]
    c = load(f.hf_dir if source == "hf" else f.gguf, "numpy").config
    assert (c.n_layer, c.n_nextn, c.n_dense_lead, c.n_rot, c.rope_neox) == (2, 1, 1, 8, True)
    assert (c.gating, c.expert_bias, c.norm_topk_prob, c.n_group, c.n_group_used) == (
        "sigmoid", True, True, 2, 1,
    )  # fmt: skip
    assert c.expert_weights_scale == pytest.approx(2.5) and c.qk_norm and not c.shexp_gated
    assert c.n_ff_shexp == c.n_ff_exp == 32


def test_the_router_bias_and_the_groups_change_which_experts_run():
    """The fixture's routing is not vacuous: on the prompt's hidden states at the MoE
    block, dropping the selection bias or the group limit changes the chosen experts."""
    model = load(FIXTURES["glm4moe"].gguf, "numpy")
    c, b = model.config, model.backend
    seen = []
    graph = model.graph
    ffn = graph._ffn

    def spy(il, h):
        if c.is_moe_layer(il):
            seen.append(b.to_numpy(b.matmul(h, model.weights[f"blk.{il}.ffn_gate_inp.weight"])))
        return ffn(il, h)

    graph._ffn = spy
    Context(model, ContextParams(n_ctx=32)).decode(Batch.for_sequence(prompt_of(), logits="all"))
    logits, bias = seen[0], graph._bias[1]
    chosen = route_experts(logits, c.n_expert_used, c.routing, bias)[0]
    unbiased = route_experts(logits, c.n_expert_used, c.routing)[0]
    ungrouped_rules = ExpertRouting(c.gating, c.norm_topk_prob, c.expert_weights_scale)
    ungrouped = route_experts(logits, c.n_expert_used, ungrouped_rules, bias)[0]
    assert not np.array_equal(np.sort(chosen), np.sort(unbiased))
    assert not np.array_equal(np.sort(chosen), np.sort(ungrouped))


def test_a_folder_saved_without_its_mtp_block_loads_without_it(tmp_path):
    """transformers' save_pretrained drops the MTP blocks but keeps
    num_nextn_predict_layers: the model loads (and converts) without them."""
    f = FIXTURES["glm4moe"]
    folder = shutil.copytree(f.hf_dir, tmp_path / "hf")
    weights = load_file(folder / "model.safetensors")
    main = {k: v for k, v in weights.items() if not k.startswith("model.layers.2.")}
    save_file(main, folder / "model.safetensors", metadata={"format": "pt"})
    trunk, full = load(folder, "numpy"), load(f.hf_dir, "numpy")
    assert (trunk.config.n_nextn, full.config.n_nextn) == (0, 1)
    batch = Batch.for_sequence(prompt_of(), logits="all")
    logits = [Context(m, ContextParams(n_ctx=32)).decode(batch) for m in (trunk, full)]
    np.testing.assert_array_equal(logits[0], logits[1])
    converted = read_gguf(convert_hf_to_gguf(folder, tmp_path / "t.gguf", RUNTIME, "f32"))
    assert converted.metadata["glm4moe.block_count"] == 2
    assert "glm4moe.nextn_predict_layers" not in converted.metadata


def test_the_mtp_block_is_stored_as_llama_cpp_stores_it():
    g = read_gguf(FIXTURES["glm4moe"].gguf)
    assert g.metadata["glm4moe.block_count"] == 3 and g.metadata["glm4moe.nextn_predict_layers"]
    for name in ("eh_proj", "enorm", "hnorm", "shared_head_norm"):
        assert f"blk.2.nextn.{name}.weight" in g.tensors
    assert g.tensors["blk.2.ffn_gate_exps.weight"].shape == (6, 32, 64)  # an MoE block


def test_tessera_plugins_lists_the_architecture(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "arch-glm4 (tessera.models.llama.glm4;" in out
    assert "arch-glm4moe (tessera.models.llama.glm4_moe;" in out
    listed = out.split("architectures: ")[1].split("\n")[0].split(", ")
    assert {"glm4", "glm4moe"} <= set(listed)


test_glm4_conformance = architecture_conformance("glm4", runtime=RUNTIME)
test_glm4_conformance_torch = architecture_conformance(
    "glm4", backend="torch", dtype="f32", runtime=RUNTIME
)
test_glm4moe_conformance = architecture_conformance("glm4moe", runtime=RUNTIME)
test_glm4moe_conformance_torch = architecture_conformance(
    "glm4moe", backend="torch", dtype="f32", runtime=RUNTIME
)

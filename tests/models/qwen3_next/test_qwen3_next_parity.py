"""Qwen3-Next against transformers, on the checkpoint in tests/data/arch/qwen3_next/hf and
the GGUF llama.cpp's converter made from it (tests/data/arch/qwen3_next/README.md).

The fixture has what makes Qwen3-Next: gated delta-net layers and gated full attention in
turn, twice as many value heads as key heads in the delta net, a causal conv of 4, partial
RoPE, Q/K norms, 4 experts of which 2 per token and a gated shared expert. tessera loads the
folder and llama.cpp's GGUF on numpy and torch (f32) and must give transformers' logits for
every row of a 16-token prompt and its greedy continuation through the cache (the prompt
in ubatches of 5, so the conv and delta states carry across ubatches); the architecture
conformance kit; ``tessera plugins`` lists the plugin; the chat template of the GGUF and
of the folder renders as transformers' ``apply_chat_template`` renders it.
"""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
import transformers
from qwen3_next_oracle import (
    BACKENDS,
    HF_DIR,
    LLAMA_CPP_F32,
    RUNTIME,
    SOURCES,
    TOL,
    context,
    greedy,
    hf_config,
    prompt,
    tessera_logits,
    transformers_answers,
)

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.testing.pytest_plugin import architecture_conformance
from tessera.text.chat_template import ChatTemplate
from tessera.text.tokenizer import Tokenizer

test_conformance_numpy = architecture_conformance("qwen3next", runtime=RUNTIME)
test_conformance_torch = architecture_conformance(
    "qwen3next", backend="torch", dtype="f32", runtime=RUNTIME
)


def test_the_fixture_exercises_both_mixers_grouped_heads_and_the_experts():
    hf = hf_config()
    assert hf["architectures"] == ["Qwen3NextForCausalLM"]
    assert hf["layer_types"] == ["linear_attention", "full_attention"] * 2
    assert hf["linear_num_value_heads"] == 2 * hf["linear_num_key_heads"]
    assert hf["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert (hf["num_experts"], hf["num_experts_per_tok"]) == (4, 2)
    assert hf["shared_expert_intermediate_size"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(source, backend):
    logits = tessera_logits(SOURCES[source], backend)
    want = transformers_answers()[0]
    assert logits.shape == want.shape
    assert np.abs(logits - want).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_through_the_cache_matches_transformers_generate(source, backend):
    ctx = context(SOURCES[source], backend, n_ubatch=5)
    assert greedy(ctx, prompt().tolist()) == transformers_answers()[1]


def test_the_folder_and_llama_cpps_gguf_read_as_the_same_model():
    arch = RUNTIME.architecture("qwen3next")
    gguf = read_gguf(LLAMA_CPP_F32)
    shapes = {n: t.shape for n, t in gguf.tensors.items()}
    from_gguf = arch.config_from_gguf(gguf.metadata, shapes)
    from_hf = arch.config_from_hf(hf_config())
    assert from_gguf.rms_eps == pytest.approx(from_hf.rms_eps)  # GGUF stores it as f32
    assert from_gguf == attrs.evolve(from_hf, rms_eps=from_gguf.rms_eps)
    assert shapes == arch.tensor_shapes(from_gguf)
    # the renamed, split and transformed HF tensors are llama.cpp's, value for value
    from safetensors.numpy import load_file

    ours = dict(arch.tensors_from_hf(from_hf, load_file(str(HF_DIR / "model.safetensors")), True))
    assert set(ours) == set(gguf.tensors)
    for name, tensor in gguf.tensors.items():
        theirs = np.frombuffer(tensor.data, "<f4").reshape(tensor.shape)  # an F32 file
        np.testing.assert_allclose(ours[name], theirs, rtol=1e-6, err_msg=name)


def test_tessera_plugins_lists_the_architecture(capsys):
    from tessera.cli.main import main

    assert main(["plugins", "--json", "--no-probe"]) == 0
    report = json.loads(capsys.readouterr().out)
    (plugin,) = [p for p in report["plugins"] if p["name"] == "arch-qwen3next"]
    assert plugin["module"] == "tessera.models.qwen3_next.arch"
    assert "qwen3next" in report["architectures"]


@pytest.mark.parametrize("chunked", ["1", "0"])
def test_a_prompt_longer_than_a_chunk_matches_transformers_on_both_delta_rule_paths(
    chunked, monkeypatch
):
    """torch runs the delta rule over a prompt in chunks of 64 (TESSERA_TORCH_CHUNKED_DELTA)
    or token by token; a 150-token prompt crosses two chunk boundaries."""
    monkeypatch.setenv("TESSERA_TORCH_CHUNKED_DELTA", chunked)
    model = load_model(LLAMA_CPP_F32, RUNTIME, RUNTIME.create_backend("torch", dtype="f32"))
    ids = prompt(11, 150)
    logits = Context(model, ContextParams(n_ctx=256)).decode(Batch.for_sequence(ids, logits="all"))
    assert np.abs(logits - transformers_answers(11, 150)[0]).max() < TOL
    path = model.backend.paths["gated delta rule"].path
    assert path == ("chunked" if chunked == "1" else "token by token")


def test_tessera_convert_writes_llama_cpps_file_and_it_runs_alike(tmp_path):
    from tessera.plugins.cmd.convert import convert_hf_to_gguf

    ours = read_gguf(convert_hf_to_gguf(HF_DIR, tmp_path / "t.gguf", RUNTIME, "f32"))
    theirs = read_gguf(LLAMA_CPP_F32)
    assert set(ours.tensors) == set(theirs.tensors)
    for name, tensor in theirs.tensors.items():
        got, want = (np.frombuffer(t.data, "<f4") for t in (ours.tensors[name], tensor))
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)  # ssm_a: exp's last bit
    # llama.cpp also writes its default full_attention_interval (4), which the layer list
    # it writes beside it overrides; tessera writes the list alone
    keys = {k: v for k, v in theirs.metadata.items() if k.startswith("qwen3next.")}
    del keys["qwen3next.full_attention_interval"]
    eps = "qwen3next.attention.layer_norm_rms_epsilon"  # f32 in both, maybe not the same f32
    assert ours.metadata[eps] == pytest.approx(keys.pop(eps))
    assert {k: ours.metadata.get(k) for k in keys} == keys
    logits = tessera_logits(tmp_path / "t.gguf", "numpy")
    assert np.abs(logits - transformers_answers()[0]).max() < TOL


def test_files_it_cannot_run_are_refused_with_the_way_out():
    from tessera.errors import ModelFileError

    arch = RUNTIME.architecture("qwen3next")
    with pytest.raises(ModelFileError, match="dense FFN layers.*every layer"):
        arch.config_from_hf(hf_config() | {"mlp_only_layers": [1]})
    gguf = read_gguf(LLAMA_CPP_F32)
    shapes = {n: t.shape for n, t in gguf.tensors.items()}
    no_inner = {k: v for k, v in gguf.metadata.items() if k != "qwen3next.ssm.inner_size"}
    with pytest.raises(ModelFileError, match="lacks 'qwen3next.ssm.inner_size'.*convert"):
        arch.config_from_gguf(no_inner, shapes)
    short = gguf.metadata | {"qwen3next.attention.recurrent_layers": [True, False]}
    with pytest.raises(ModelFileError, match="2 layer kinds for 4 layers.*convert it again"):
        arch.config_from_gguf(short, shapes)


TEMPLATE = HF_DIR.parents[2] / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
USER = {"role": "user", "content": "What is the capital of France?"}
THOUGHT = {"role": "assistant", "content": "<think>\nIt is Paris.\n</think>\n\nParis."}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "capital", "arguments": {"country": "Italy"}}}],
}
RESULT = {"role": "tool", "content": "Rome"}
TOOL = {
    "type": "function",
    "function": {
        "name": "capital",
        "description": "The capital of a country.",
        "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
    },
}
#: (messages, tools, add_generation_prompt, extra template variables)
CONVERSATIONS = {
    "system-user": ([SYSTEM, USER], None, True, {}),
    "thought-then-follow-up": ([USER, THOUGHT, USER], None, True, {}),
    "finished": ([SYSTEM, USER, THOUGHT], None, False, {}),
    "tool-call-and-result": ([USER, CALL, RESULT], [TOOL], True, {}),
    "thinking-off": ([USER], None, True, {"enable_thinking": False}),
}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_chat_template_renders_as_transformers_renders_it(source, conversation):
    messages, tools, add_generation_prompt, extra = CONVERSATIONS[conversation]
    tok = Tokenizer.from_path(SOURCES[source])
    assert tok.chat_template == TEMPLATE.read_text(encoding="utf-8")  # Qwen3's, as shipped
    eos = tok.token_to_piece(tok.eos_id)
    ours = ChatTemplate(tok.chat_template, "", eos)
    hf = transformers.AutoTokenizer.from_pretrained(HF_DIR)
    want = hf.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    got = ours.render(messages, tools, add_generation_prompt=add_generation_prompt, **extra)
    assert got == want
    assert USER["content"] in got

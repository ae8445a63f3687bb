"""gpt-oss against transformers, on the checkpoint in tests/data/arch/gpt-oss/hf and the GGUF
llama.cpp's converter made from it (tests/data/arch/gpt-oss/README.md says how).

The fixture has what makes gpt-oss gpt-oss: a learned sink per head in every softmax,
layers that slide (window 4) and attend fully in turn, YaRN x32 with transformers' exact
correction range (``truncate: false``), Q/K/V/O biases, 6 experts of which 4 per token are
weighed by the softmax of their router logits (router with a bias), expert biases and the
SwiGLU clamped at 7 (wide expert weights, so the clamps bite). tessera loads the folder,
llama.cpp's GGUF and its own conversion, on numpy and torch (f32), and must give
transformers' logits for every row of a 16-token prompt (measured max abs error 5e-6;
logits std 0.79) and its greedy continuation, prefilled in ubatches of 5. tessera's
conversion writes llama.cpp's tensors bit for bit; the chat template the GGUF carries renders
and tokenizes as transformers' ``apply_chat_template``; the architecture conformance kit;
``tessera plugins`` lists the plugin.
"""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
from gpt_oss_oracle import (
    BACKENDS,
    HF_DIR,
    LLAMA_CPP_F32,
    N_PROMPT,
    RUNTIME,
    TOL,
    hf_config,
    load,
    tessera_greedy,
    tessera_logits,
    transformers_answers,
)

from tessera.files.gguf import read_gguf
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.pytest_plugin import architecture_conformance
from tessera.text.chat_template import ChatTemplate

test_conformance_numpy = architecture_conformance("gpt-oss", runtime=RUNTIME)
test_conformance_torch = architecture_conformance(
    "gpt-oss", backend="torch", dtype="f32", runtime=RUNTIME
)
SOURCES = ("hf", "llama.cpp-gguf", "tessera-gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    converted = convert_hf_to_gguf(
        HF_DIR, tmp_path_factory.mktemp("gpt-oss") / "t.gguf", RUNTIME, "f32"
    )
    return {"hf": HF_DIR, "llama.cpp-gguf": LLAMA_CPP_F32, "tessera-gguf": converted}


def expected(source: str) -> tuple[np.ndarray, list[int]]:
    # llama.cpp's file cannot say truncate: false; tessera's says it in a key of its own
    return transformers_answers(HF_DIR, truncate=True if source == "llama.cpp-gguf" else None)


def test_the_fixture_exercises_the_window_the_sinks_yarn_and_the_experts():
    hf = hf_config()
    assert hf["architectures"] == ["GptOssForCausalLM"]
    assert hf["sliding_window"] < N_PROMPT
    assert hf["layer_types"] == ["sliding_attention", "full_attention"]
    assert hf["rope_parameters"]["rope_type"] == "yarn"
    assert hf["rope_parameters"]["truncate"] is False
    assert (hf["num_local_experts"], hf["num_experts_per_tok"]) == (6, 4)


def test_yarn_truncation_changes_the_logits_far_beyond_the_tolerance():
    """Why the llama.cpp GGUF is compared with ``truncate: true``: the two differ."""
    exact, truncated = transformers_answers(HF_DIR)[0], transformers_answers(HF_DIR, True)[0]
    assert np.abs(exact - truncated).max() > 100 * TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(files, source, backend):
    logits = tessera_logits(files[source], backend)
    want = expected(source)[0]
    assert logits.shape == want.shape
    assert np.abs(logits - want).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_generate(files, source, backend):
    assert tessera_greedy(files[source], backend) == expected(source)[1]


def test_llama_cpp_gguf_reads_as_the_folder_and_tessera_writes_it_alike(files):
    arch = RUNTIME.architecture("gpt-oss")
    from_hf = arch.config_from_hf(hf_config())
    theirs, ours = read_gguf(LLAMA_CPP_F32), read_gguf(files["tessera-gguf"])
    for gguf, truncate in ((theirs, True), (ours, False)):
        shapes = {n: t.shape for n, t in gguf.tensors.items()}
        config = arch.config_from_gguf(gguf.metadata, shapes)
        assert config.rms_eps == pytest.approx(from_hf.rms_eps)  # GGUF stores it as f32
        want = attrs.evolve(from_hf, yarn=attrs.evolve(from_hf.yarn, truncate=truncate))
        assert attrs.evolve(config, rms_eps=from_hf.rms_eps) == want
    # the same tensors, bit for bit: names, the gate/up split, the transposes, the biases
    assert set(ours.tensors) == set(theirs.tensors)
    for name, tensor in theirs.tensors.items():
        assert ours.tensors[name].shape == tensor.shape, name
        assert np.array_equal(ours.tensors[name].data, tensor.data), name
    keys = {k: v for k, v in theirs.metadata.items() if k.startswith("gpt-oss.")}
    assert {k: ours.metadata.get(k) for k in keys} == keys
    assert ours.metadata["gpt-oss.rope.scaling.yarn_truncate"] is False


def test_tessera_plugins_lists_the_architecture(capsys):
    from tessera.cli.main import main

    assert main(["plugins", "--json", "--no-probe"]) == 0
    report = json.loads(capsys.readouterr().out)
    (plugin,) = [p for p in report["plugins"] if p["name"] == "arch-gpt-oss"]
    assert plugin["module"] == "tessera.models.gpt_oss.arch"
    assert "gpt-oss" in report["architectures"]


CONVERSATION = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "Another one?"},
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_of_the_gguf_renders_and_tokenizes_as_transformers(add_generation_prompt):
    from transformers import AutoTokenizer

    tok = load(LLAMA_CPP_F32, "numpy").tokenizer
    bos, eos = tok.token_to_piece(tok.bos_id), tok.token_to_piece(tok.eos_id)
    assert (bos, eos) == ("<|startoftext|>", "<|return|>")
    hf = AutoTokenizer.from_pretrained(HF_DIR)
    want = hf.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    ours = ChatTemplate(tok.chat_template, bos, eos)
    assert ours.render(CONVERSATION, add_generation_prompt=add_generation_prompt) == want
    assert "<|start|>user<|message|>Another one?<|end|>" in want
    # the harmony markers are single tokens, as in transformers' encoding
    ids = tok.encode(want, add_special=False, parse_special=True)
    assert ids == hf(want, add_special_tokens=False)["input_ids"]


def test_what_llama_cpp_cannot_derive_round_trips_through_tessera_keys():
    """A layer pattern other than period 2, a sliding base of its own, untruncated YaRN and
    other SwiGLU constants are written as keys (llama.cpp's pattern key, tessera's others)."""
    arch = RUNTIME.architecture("gpt-oss")
    config = arch.example_config(n_layer=3)
    config = attrs.evolve(
        config,
        swa_layers=(False, True, True),
        rope_freq_base_swa=10000.0,
        yarn=attrs.evolve(config.yarn, truncate=False),
        swiglu_alpha=1.5,
        swiglu_limit=5.0,
    )
    metadata = arch.gguf_metadata(config)
    assert metadata["gpt-oss.attention.sliding_window_pattern"] == [False, True, True]
    assert arch.config_from_gguf(metadata, arch.tensor_shapes(config)) == config
    plain = arch.example_config(n_layer=3)
    keys = arch.gguf_metadata(plain)
    assert not {"sliding_window_pattern", "yarn_truncate", "swiglu_alpha"} & {
        k.rsplit(".", 1)[-1] for k in keys
    }
    assert arch.config_from_gguf(keys, arch.tensor_shapes(plain)) == plain

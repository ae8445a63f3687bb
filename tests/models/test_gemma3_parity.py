"""Gemma 3 against transformers, on the checkpoint in tests/data/arch/gemma3/ and the GGUF that
llama.cpp's own converter made from it (tests/data/arch/gemma3/README.md says how).

The oracle is transformers run here on the committed ``Gemma3ForCausalLM`` folder (7 layers:
five sliding, the global layer 5, one sliding; window 4; QK-norm; local RoPE base 10000,
global 1e6 with linear scaling by 8; 4 query heads of 16 over a 32-wide stream). tessera
loads the folder itself, the llama.cpp GGUF and the GGUF ``tessera convert`` writes, on
numpy and torch (f32), and must give transformers' logits for every row of a 16-token
prompt (measured max abs error 2.0e-6; logits std 0.57) and its greedy continuation,
prefilled in ubatches of 5.
"""

from __future__ import annotations

import json

import pytest
from gemma_parity import (
    N_PROMPT,
    RUNTIME,
    check_chat_template,
    check_ggufs_read_as_the_folder,
    files,
    gguf_template,
    hf_tokenizer,
    parity_tests,
)

from tessera.testing.pytest_plugin import architecture_conformance
from tessera.text.chat_template import ChatTemplateRejected

HF_DIR = files("gemma3")[0]

test_conformance_numpy = architecture_conformance("gemma3", runtime=RUNTIME)
test_conformance_torch = architecture_conformance(
    "gemma3", backend="torch", dtype="f32", runtime=RUNTIME
)


(
    oracle,
    test_logits_of_every_prompt_row_match_transformers,
    test_greedy_continuation_matches_transformers_generate,
) = parity_tests("gemma3")


def test_the_fixture_exercises_the_window_and_both_ropes():
    hf = json.loads((HF_DIR / "config.json").read_text())
    assert hf["model_type"] == "gemma3_text" and hf["architectures"] == ["Gemma3ForCausalLM"]
    assert hf["sliding_window"] < N_PROMPT
    assert hf["layer_types"][4:] == ["sliding_attention", "full_attention", "sliding_attention"]
    rope = hf["rope_parameters"]
    assert rope["full_attention"]["rope_type"] == "linear" and rope["full_attention"]["factor"] > 1
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]


def test_llama_cpp_gguf_reads_as_the_folder_and_tessera_writes_it_alike(oracle):
    theirs, ours = check_ggufs_read_as_the_folder("gemma3", oracle["files"]["tessera-gguf"])
    for key in (
        "attention.sliding_window",
        "rope.freq_base",
        "rope.freq_base_swa",
        "rope.scaling.type",
        "rope.scaling.factor",
    ):
        assert ours.metadata[f"gemma3.{key}"] == theirs.metadata[f"gemma3.{key}"], key
    assert "gemma3.attention.sliding_window_pattern" not in ours.metadata  # llama.cpp's period


def test_a_gemma3_text_folder_of_an_encoder_still_goes_to_gemma_embedding():
    hf = json.loads((HF_DIR / "config.json").read_text())
    assert RUNTIME.hf_architecture_for(hf).names == ("gemma3",)
    encoder = dict(hf, architectures=["Gemma3TextModel"], use_bidirectional_attention=True)
    assert RUNTIME.hf_architecture_for(encoder).names == ("gemma-embedding",)


SYSTEM = {"role": "system", "content": "Be brief."}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "user", "content": " Name a prime. "},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": "Another one?"},
    ],
    [SYSTEM, {"role": "user", "content": "Hello there"}],
    [
        SYSTEM,
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Parts, "},
                {"type": "text", "text": " as a list"},
            ],
        },
    ],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(
    "messages", CONVERSATIONS, ids=["one-turn", "three-turns", "system", "content-parts"]
)
def test_chat_template_renders_as_transformers(messages, add_generation_prompt):
    check_chat_template("gemma3", messages, add_generation_prompt)


def test_chat_template_refuses_roles_out_of_turn_as_transformers_does():
    ours = gguf_template("gemma3")
    messages = [{"role": "assistant", "content": "Hi."}, *CONVERSATIONS[0]]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        hf_tokenizer("gemma3", "<bos>", "<eos>").apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateRejected, match="Conversation roles must alternate"):
        ours.render(messages)

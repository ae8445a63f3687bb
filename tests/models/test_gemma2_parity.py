"""Gemma 2 against transformers, on the checkpoint in tests/data/arch/gemma2/ and the GGUF that
llama.cpp's own converter made from it (tests/data/arch/gemma2/README.md says how).

The oracle is transformers run here on the committed folder (4 layers alternating sliding
and global attention, window 4, attention scores capped at 1 and logits at 2, so both caps
bend, 4 query heads of 16 over a 32-wide stream). tessera loads the folder itself, the
llama.cpp GGUF and the GGUF ``tessera convert`` writes, on numpy and torch (f32), and must
give transformers' logits for every row of a 16-token prompt (measured max abs error
1.4e-6; logits std 0.53) and its greedy continuation, prefilled in ubatches of 5.
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

HF_DIR = files("gemma2")[0]

test_conformance_numpy = architecture_conformance("gemma2", runtime=RUNTIME)
test_conformance_torch = architecture_conformance(
    "gemma2", backend="torch", dtype="f32", runtime=RUNTIME
)


(
    oracle,
    test_logits_of_every_prompt_row_match_transformers,
    test_greedy_continuation_matches_transformers_generate,
) = parity_tests("gemma2")


def test_the_fixture_exercises_the_window_and_both_caps():
    hf = json.loads((HF_DIR / "config.json").read_text())
    assert hf["architectures"] == ["Gemma2ForCausalLM"]
    assert hf["sliding_window"] < N_PROMPT
    assert "sliding_attention" in hf["layer_types"] and "full_attention" in hf["layer_types"]
    assert hf["attn_logit_softcapping"] and hf["final_logit_softcapping"]


def test_llama_cpp_gguf_reads_as_the_folder_and_tessera_writes_it_alike(oracle):
    theirs, ours = check_ggufs_read_as_the_folder("gemma2", oracle["files"]["tessera-gguf"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window"):
        assert ours.metadata[f"gemma2.{key}"] == theirs.metadata[f"gemma2.{key}"]


CONVERSATIONS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "user", "content": " Name a prime. "},
        {"role": "assistant", "content": "Seven."},
        {"role": "user", "content": "Another one?"},
    ],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "three-turns"])
def test_chat_template_renders_as_transformers(messages, add_generation_prompt):
    check_chat_template("gemma2", messages, add_generation_prompt)


def test_chat_template_refuses_a_system_turn_as_transformers_does():
    ours = gguf_template("gemma2")
    messages = [{"role": "system", "content": "Be brief."}, *CONVERSATIONS[0]]
    with pytest.raises(Exception, match="System role not supported"):
        hf_tokenizer("gemma2", "<bos>", "<eos>").apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateRejected, match="System role not supported"):
        ours.render(messages)

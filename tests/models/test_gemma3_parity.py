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
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch
import transformers  # the oracle (in the test extra)

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.pytest_plugin import architecture_conformance
from tessera.text.chat_template import ChatTemplate, ChatTemplateRejected

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
DATA = Path(__file__).resolve().parents[1] / "data" / "arch" / "gemma3"
HF_DIR, LLAMA_CPP_GGUF = DATA / "hf", DATA / "gemma3-f32.gguf"
SOURCES = ("hf", "llama.cpp-gguf", "tessera-gguf")
N_PROMPT, N_PREDICT, TOL = 16, 10, 2e-5

test_conformance_numpy = architecture_conformance("gemma3", runtime=RUNTIME)
test_conformance_torch = architecture_conformance(
    "gemma3", backend="torch", dtype="f32", runtime=RUNTIME
)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    converted = convert_hf_to_gguf(
        HF_DIR, tmp_path_factory.mktemp("gemma3") / "t.gguf", RUNTIME, "f32"
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        HF_DIR, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config.eos_token_id = None  # generate all N_PREDICT tokens
    prompt = np.random.default_rng(5).integers(0, model.config.vocab_size, N_PROMPT)
    ids = torch.tensor(prompt)[None]
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    files = {"hf": HF_DIR, "llama.cpp-gguf": LLAMA_CPP_GGUF, "tessera-gguf": converted}
    return {
        "files": files,
        "prompt": prompt,
        "logits": logits,
        "greedy": out[0, N_PROMPT:].tolist(),
    }


def load(path, backend_name):
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend_name, dtype="f32"))


def test_the_fixture_exercises_the_window_and_both_ropes():
    hf = json.loads((HF_DIR / "config.json").read_text())
    assert hf["model_type"] == "gemma3_text" and hf["architectures"] == ["Gemma3ForCausalLM"]
    assert hf["sliding_window"] < N_PROMPT
    assert hf["layer_types"][4:] == ["sliding_attention", "full_attention", "sliding_attention"]
    rope = hf["rope_parameters"]
    assert rope["full_attention"]["rope_type"] == "linear" and rope["full_attention"]["factor"] > 1
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_logits_of_every_prompt_row_match_transformers(oracle, source, backend):
    model = load(oracle["files"][source], backend)
    assert model.config.arch == "gemma3"
    ctx = Context(model, ContextParams(n_ctx=64))
    logits = ctx.decode(Batch.for_sequence(oracle["prompt"], logits="all"))
    assert logits.shape == oracle["logits"].shape
    assert np.abs(logits - oracle["logits"]).max() < TOL


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", SOURCES)
def test_greedy_continuation_matches_transformers_generate(oracle, source, backend):
    # ubatches of 5: the window is read across ubatches from the KV cache
    ctx = Context(load(oracle["files"][source], backend), ContextParams(n_ctx=64, n_ubatch=5))
    sampler = Sampler(SamplerParams(temperature=0))
    tokens = list(generate(ctx, oracle["prompt"].tolist(), N_PREDICT, sampler))
    assert tokens == oracle["greedy"]


def test_llama_cpp_gguf_reads_as_the_folder_and_tessera_writes_it_alike(oracle):
    arch = RUNTIME.architecture("gemma3")
    hf_config = arch.config_from_hf(json.loads((HF_DIR / "config.json").read_text()))
    theirs, ours = read_gguf(LLAMA_CPP_GGUF), read_gguf(oracle["files"]["tessera-gguf"])
    for gguf in (theirs, ours):
        shapes = {n: t.shape for n, t in gguf.tensors.items()}
        config = arch.config_from_gguf(gguf.metadata, shapes)
        assert config.rms_eps == pytest.approx(hf_config.rms_eps)  # GGUF stores it as f32
        assert attrs.evolve(config, rms_eps=hf_config.rms_eps) == hf_config
    # the same tensors, bit for bit: names, layout and Gemma's 1 + w norms
    assert set(ours.tensors) == set(theirs.tensors)
    for name, tensor in theirs.tensors.items():
        assert ours.tensors[name].shape == tensor.shape, name
        assert np.array_equal(ours.tensors[name].data, tensor.data), name
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
    model = load(LLAMA_CPP_GGUF, "numpy")
    tok = model.tokenizer
    bos, eos = tok.token_to_piece(tok.bos_id), tok.token_to_piece(tok.eos_id)
    assert (bos, eos) == ("<bos>", "<eos>")
    ours = ChatTemplate(tok.chat_template, bos, eos)
    theirs = hf_tokenizer(bos, eos)
    want = theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == want
    assert want.startswith("<bos><start_of_turn>user\n")


def test_chat_template_refuses_roles_out_of_turn_as_transformers_does():
    model = load(LLAMA_CPP_GGUF, "numpy")
    ours = ChatTemplate(model.tokenizer.chat_template, "<bos>", "<eos>")
    messages = [{"role": "assistant", "content": "Hi."}, *CONVERSATIONS[0]]
    with pytest.raises(Exception, match="Conversation roles must alternate"):
        hf_tokenizer("<bos>", "<eos>").apply_chat_template(messages, tokenize=False)
    with pytest.raises(ChatTemplateRejected, match="Conversation roles must alternate"):
        ours.render(messages)


def hf_tokenizer(bos: str, eos: str):
    """A transformers tokenizer carrying the folder's chat template (its SentencePiece model
    needs the sentencepiece package to load, and templates render text only)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    template = json.loads((HF_DIR / "tokenizer_config.json").read_text())["chat_template"]
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=template,
        bos_token=bos,
        eos_token=eos,
    )

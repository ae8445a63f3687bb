"""The bundled default model: loads, matches an independent reader, and a golden greedy run.

The oracle is transformers reading the same GGUF file (``gguf_file=``), which follows
llama.cpp's layout; the golden text pins tessera's own greedy output so any change to
tokenization, the forward pass or sampling that alters it is seen.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tessera.cli.main import main
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
PROMPT = "The for statement"
N_GOLDEN = 24
# Recorded from tessera's numpy backend; transformers' greedy run of the same checkpoint
# gave the same text (training/out/samples.txt).
GOLDEN = ',\nthe "try" statement is executed.\n\nThe "except" statement is executed in the "except"'


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path(), RUNTIME, "numpy")


def greedy(model, text: str, n: int) -> list[int]:
    ctx = Context(model, ContextParams(n_ctx=256))
    prompt = model.tokenizer.encode(text)
    sampler = Sampler(SamplerParams(temperature=0))
    return list(generate(ctx, prompt, n, sampler, eog_ids=model.tokenizer.eog_ids))


def test_default_model_is_a_small_llama_with_its_own_vocabulary(model):
    assert model.config.arch == "llama"
    n_params = sum(int(np.prod(np.shape(w))) for w in model.weights.values())
    assert 1_000_000 < n_params < 20_000_000
    assert 2000 <= model.tokenizer.n_vocab <= 8192
    assert model.chat_template and "<|im_start|>" in model.chat_template


def test_logits_match_transformers_reading_the_same_file(model):
    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = model.tokenizer.encode("A list comprehension consists of brackets containing")
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    ctx = Context(model, ContextParams(n_ctx=128))
    got = ctx.decode(Batch.for_sequence(ids, logits="all"))
    assert np.abs(got - want).max() < 1e-3
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_greedy_run_is_golden(model):
    text = model.tokenizer.decode(greedy(model, PROMPT, N_GOLDEN))
    assert text == GOLDEN


def test_torch_backend_generates_the_same_greedy_tokens(model):
    torch_model = load_model(default_model_path(), RUNTIME, "torch", dtype="f32")
    assert greedy(torch_model, PROMPT, N_GOLDEN) == greedy(model, PROMPT, N_GOLDEN)


def test_tessera_run_without_m_uses_the_default_model(capsys):
    code = main(["run", "-p", PROMPT, "-n", str(N_GOLDEN), "--temp", "0", "--backend", "numpy"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == GOLDEN + "\n"

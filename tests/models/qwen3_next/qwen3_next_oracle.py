"""The qwen3_next fixtures (tests/data/arch/qwen3_next/, made by make_fixture_qwen3_next.py)
and transformers' answers on them, shared by the qwen3_next tests.

The oracle is transformers itself, loading the committed folder in float32 (its reference
PyTorch gated delta rule: chunked for a prompt, recurrent per generated token).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from tessera.contract.spec import Draft, SpecDecoder
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
# torch is installed with the project: a missing torch backend is a failure, not a skip
BACKENDS = ["numpy", "torch"]
DATA = Path(__file__).resolve().parents[2] / "data" / "arch" / "qwen3_next"
HF_DIR, LLAMA_CPP_F32 = DATA / "hf", DATA / "qwen3next-f32.gguf"
SOURCES = {"hf": HF_DIR, "llama.cpp-gguf": LLAMA_CPP_F32}
#: Measured max abs error 7e-6 (numpy) and 4e-6 (torch) on logits of std 0.8.
N_PROMPT, N_PREDICT, TOL = 16, 8, 3e-5
#: Per verify step, which draft position is made wrong (None: the whole draft is right).
WRONG_AT = [None, 1, 0, 2, None, 1, 0, None]


def hf_config() -> dict[str, Any]:
    return json.loads((HF_DIR / "config.json").read_text())


def prompt(seed: int = 7, n: int = N_PROMPT) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, hf_config()["vocab_size"], n)


@functools.cache
def hf_model() -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # generate all N_PREDICT tokens
    return model.eval()


@functools.cache
def transformers_answers(seed: int = 7, n: int = N_PROMPT) -> tuple[np.ndarray, list[int]]:
    """transformers' logits of every prompt row and its greedy continuation."""
    ids = torch.tensor(prompt(seed, n))[None]
    with torch.no_grad():
        logits = hf_model()(ids).logits[0].numpy()
        out = hf_model().generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    return logits, out[0, n:].tolist()


@functools.cache
def load(path: Path, backend: str) -> Any:
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))


def context(path: Path, backend: str, **params: Any) -> Context:
    return Context(load(path, backend), ContextParams(**{"n_ctx": 64} | params))


def tessera_logits(path: Path, backend: str) -> np.ndarray:
    return context(path, backend).decode(Batch.for_sequence(prompt(), logits="all"))


def greedy(ctx: Context, tokens: list[int], seq_id: int = 0, n_past: int = 0) -> list[int]:
    sampler = Sampler(SamplerParams(temperature=0))
    return list(generate(ctx, tokens, N_PREDICT, sampler, seq_id=seq_id, n_past=n_past))


class ScriptedDrafter(SpecDecoder):
    """Drafts the known continuation of whichever of ``sequences`` (prompt + transformers'
    tokens) the history is a prefix of, one token of each draft made wrong as
    :data:`WRONG_AT` says."""

    def __init__(self, sequences: list[list[int]], n_vocab: int) -> None:
        self.sequences, self.n_vocab, self.step = sequences, n_vocab, 0

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        n = len(history)
        (known,) = [s for s in self.sequences if s[:n] == list(history)]
        tokens = known[n : n + n_max]
        wrong = WRONG_AT[self.step % len(WRONG_AT)]
        self.step += 1
        if wrong is not None and wrong < len(tokens):
            tokens[wrong] = (tokens[wrong] + 1) % self.n_vocab
        return Draft(tokens)

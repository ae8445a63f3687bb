"""The gpt-oss fixtures (tests/data/arch/gpt-oss/, made by make_fixture_gpt_oss.py) and
transformers' answers on them, shared by the gpt-oss tests.

The oracle is transformers itself, loading a committed folder in float32: ``hf/`` as it is,
``hf-mxfp4/`` dequantized by transformers' own MXFP4 code. llama.cpp's GGUFs cannot state
the checkpoints' ``truncate: false`` (YaRN's correction range kept exact), so the model
they describe is transformers' with ``truncate: true``, as ggml computes it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
DATA = Path(__file__).resolve().parents[1] / "data" / "arch" / "gpt-oss"
HF_DIR, HF_MXFP4_DIR = DATA / "hf", DATA / "hf-mxfp4"
LLAMA_CPP_F32, LLAMA_CPP_MXFP4 = DATA / "gpt-oss-f32.gguf", DATA / "gpt-oss-mxfp4.gguf"
LLAMA_QUANTIZE_MXFP4_MOE = DATA / "gpt-oss-MXFP4_MOE.gguf"
#: The prompt is longer than the sliding window (4).
N_PROMPT, N_PREDICT, TOL = 16, 8, 2e-5


def hf_config(folder: Path = HF_DIR) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


def prompt() -> np.ndarray:
    return np.random.default_rng(7).integers(0, hf_config()["vocab_size"], N_PROMPT)


@functools.cache
def transformers_answers(folder: Path, truncate: bool | None = None) -> tuple[np.ndarray, list]:
    """transformers' logits of every prompt row and its greedy continuation for the folder,
    with YaRN's ``truncate`` overridden when given."""
    overrides = {}
    if truncate is not None:
        overrides["rope_parameters"] = hf_config(folder)["rope_parameters"] | {"truncate": truncate}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, **overrides
    ).eval()
    model.generation_config.eos_token_id = None  # generate all N_PREDICT tokens
    ids = torch.tensor(prompt())[None]
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    return logits, out[0, N_PROMPT:].tolist()


def load(path: Path, backend: str) -> Any:
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))


def tessera_logits(path: Path, backend: str) -> np.ndarray:
    ctx = Context(load(path, backend), ContextParams(n_ctx=64))
    return ctx.decode(Batch.for_sequence(prompt(), logits="all"))


def tessera_greedy(path: Path, backend: str) -> list[int]:
    # ubatches of 5: the window and the sinks are read across ubatches from the KV cache
    ctx = Context(load(path, backend), ContextParams(n_ctx=64, n_ubatch=5))
    sampler = Sampler(SamplerParams(temperature=0))
    return list(generate(ctx, prompt().tolist(), N_PREDICT, sampler))

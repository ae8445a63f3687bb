"""Qwen3-Next with scaled RoPE against transformers: YaRN (its long-context recipe) from the
folder and from the GGUF llama.cpp's converter wrote of it
(``tests/data/arch/qwen3_next/qwen3next-yarn-f32.gguf``), and linear from the folder.

The scaled folders are the committed checkpoint with its ``config.json`` changed, rebuilt
here as ``make_fixture_qwen3_next.py`` built the one it converted. The oracle is
transformers on each folder: logits of every prompt row and greedy ``generate``.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch
import transformers
from qwen3_next_oracle import BACKENDS, DATA, HF_DIR, N_PREDICT, RUNTIME, TOL, hf_config, prompt

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import ModelFileError
from tessera.files.load import load_model

LLAMA_CPP_YARN = DATA / "qwen3next-yarn-f32.gguf"
ROPE = {"rope_theta": 10000.0, "partial_rotary_factor": 0.25}
#: config.json changes of each variant (yarn: as make_fixture_qwen3_next.py's YARN)
VARIANTS = {
    "yarn": {
        "max_position_embeddings": 256,
        "rope_parameters": ROPE
        | {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    },
    "linear": {"rope_parameters": ROPE | {"rope_type": "linear", "factor": 2.0}},
}
SOURCES = [("yarn", "hf"), ("yarn", "llama.cpp-gguf"), ("linear", "hf")]
TMP = Path(tempfile.mkdtemp(prefix="qwen3next-rope-"))
atexit.register(shutil.rmtree, TMP, True)


@functools.cache
def folder(variant: str) -> Path:
    out = TMP / variant
    if not out.exists():
        shutil.copytree(HF_DIR, out)
        (out / "config.json").write_text(json.dumps(hf_config() | VARIANTS[variant]))
    return out


@functools.cache
def transformers_answers(variant: str) -> tuple[np.ndarray, list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder(variant), dtype=torch.float32)
    model.generation_config.eos_token_id = None
    ids = torch.tensor(prompt())[None]
    with torch.no_grad():
        logits = model(ids).logits[0].numpy()
        out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
    return logits, out[0, ids.shape[1] :].tolist()


def path(variant: str, source: str) -> Path:
    return LLAMA_CPP_YARN if source == "llama.cpp-gguf" else folder(variant)


@functools.cache
def model(variant: str, source: str, backend: str):
    return load_model(path(variant, source), RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("variant", "source"), SOURCES)
def test_logits_and_greedy_tokens_match_transformers(variant, source, backend):
    want_logits, want_tokens = transformers_answers(variant)
    m = model(variant, source, backend)
    got = Context(m, ContextParams(n_ctx=64)).decode(Batch.for_sequence(prompt(), logits="all"))
    np.testing.assert_allclose(got, want_logits, atol=TOL, rtol=0)
    ctx = Context(m, ContextParams(n_ctx=64, n_ubatch=5))
    sampler = Sampler(SamplerParams(temperature=0))
    assert list(generate(ctx, prompt().tolist(), N_PREDICT, sampler)) == want_tokens


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_scaling_matters_for_this_prompt(variant):
    unscaled = transformers.AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=torch.float32)
    with torch.no_grad():
        plain = unscaled(torch.tensor(prompt())[None]).logits[0].numpy()
    assert np.abs(transformers_answers(variant)[0] - plain).max() > 100 * TOL


def test_llama_cpps_gguf_reads_as_the_folder_and_tessera_writes_its_keys():
    arch = RUNTIME.architecture("qwen3next")
    from_hf = arch.config_from_hf(json.loads((folder("yarn") / "config.json").read_text()))
    from_gguf = model("yarn", "llama.cpp-gguf", "numpy").config
    assert from_gguf.rope_scaling.kind == "yarn"
    assert from_gguf == attrs.evolve(from_hf, rms_eps=from_gguf.rms_eps)
    meta = model("yarn", "llama.cpp-gguf", "numpy").metadata
    ours = arch.gguf_metadata(from_hf)
    rope_keys = {k for k in meta if ".rope.scaling." in k}
    assert rope_keys == {k for k in ours if ".rope.scaling." in k}
    assert all(ours[k] == meta[k] for k in rope_keys)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"rope_type": "longrope"}, "scales RoPE with 'longrope'"),
        ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2}, "sets attention_factor"),
        ({"rope_type": "yarn", "factor": 4.0, "truncate": False}, "sets truncate"),
    ],
)
def test_scalings_gguf_cannot_state_are_refused(change, words):
    hf = hf_config() | {"rope_parameters": ROPE | {"original_max_position_embeddings": 64} | change}
    with pytest.raises(ModelFileError, match=words):
        RUNTIME.architecture("qwen3next").config_from_hf(hf)

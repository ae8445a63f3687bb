"""``gemma-embedding`` (EmbeddingGemma) against transformers on a random-weight checkpoint.

The checkpoint is a bidirectional ``Gemma3TextModel`` made by transformers (7 layers, so
one is global; a sliding window short enough to cut the longer input) inside a
sentence-transformers folder (mean Pooling, two bias-free Dense projections, Normalize).
The oracle is transformers' hidden states, mean-pooled over the attention mask, projected
by the two Dense weights and L2-normalized; tessera must match from the folder and from
the converted GGUF, on every backend, within 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tessera.engine.embed import Embedder
from tessera.errors import TesseraError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.testing.models import WEIGHT_STD
from tessera.testing.sentence_transformers import write_sentence_transformers_modules

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
DENSE = 96
#: Widths of the tiny Gemma 3 text models here (hidden 64, 4 query / 2 KV heads of 16).
TINY = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}


def make_embedding_gemma_dir(path):
    config = transformers.Gemma3TextConfig(
        **TINY,
        num_hidden_layers=7,
        query_pre_attn_scalar=32,
        max_position_embeddings=128,
        sliding_window=8,  # rows see |i - j| < 5 on sliding layers
        use_bidirectional_attention=True,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3TextModel(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * 0.1)
    path.mkdir(parents=True)
    model.save_pretrained(path)
    weights = [
        (torch.randn(n_out, n_in) * WEIGHT_STD * 5).numpy()
        for n_in, n_out in ((64, DENSE), (DENSE, 64))
    ]
    write_sentence_transformers_modules(path, weights, normalize=True)
    return model, weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemma-emb")
    model, dense = make_embedding_gemma_dir(tmp / "eg")
    gguf = convert_hf_to_gguf(tmp / "eg", tmp / "eg-f32.gguf", RUNTIME, "f32")
    rng = np.random.default_rng(1)
    inputs = [rng.integers(0, 256, n).tolist() for n in (12, 4, 9)]
    width = max(map(len, inputs))
    ids = torch.tensor([t + [0] * (width - len(t)) for t in inputs])
    mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in inputs])
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
    m = mask.numpy()[..., None]
    pooled = (hidden * m).sum(1) / m.sum(1)
    projected = pooled @ dense[0].T @ dense[1].T
    return {"hf": tmp / "eg", "gguf": gguf}, inputs, projected


@pytest.mark.parametrize("source", ["hf", "gguf"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_pooled_projected_embeddings_match_transformers(checkpoint, source, backend):
    files, inputs, projected = checkpoint
    model = load_model(files[source], RUNTIME, backend, dtype="f32")
    emb = Embedder(model, normalize=-1, mrl_dims=[16, 32, 64])
    assert emb.pooling == "mean" and not emb.causal and emb.n_embd == 64
    np.testing.assert_allclose(emb.embed(inputs), projected, atol=1e-4, rtol=1e-4)
    cut = projected[:, :32] / np.linalg.norm(projected[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(
        Embedder(model, mrl_dims=[16, 32, 64]).embed(inputs, dims=32), cut, atol=1e-4
    )
    with pytest.raises(TesseraError, match="16, 32, 64"):
        emb.embed(inputs, dims=48)


def test_causal_gemma3_is_refused(tmp_path):
    config = transformers.Gemma3TextConfig(**TINY, num_hidden_layers=1)
    transformers.Gemma3TextModel(config).save_pretrained(tmp_path)
    with pytest.raises(TesseraError, match="only bidirectional"):
        load_model(tmp_path, RUNTIME, "numpy")

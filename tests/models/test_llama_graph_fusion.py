"""The decoder-block fusion is asked to run only blocks a ``DecoderBlock`` describes.

A fusion sees Q/K/V, RMSNorm, plain RoPE, attention with one scale and a SwiGLU FFN; a
sliding window, NoPE layers, RoPE factors or a magnitude scale, the attention temperature,
a residual scale, post-norms, a Q/K norm over the whole projection and fused tensors are
outside it, so a graph of such a model must run its own ops at decode. The check: a spy
fusion registered for the torch backend records every block it is handed (and declines, so
the ops still run); a decode step of each committed llama-family model hands it blocks
exactly when the model is plain (linear RoPE scaling is a plain ``freq_scale``; llama.cpp's
Mistral file has no window left).
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_like import FIXTURES, RUNTIME, load

from tessera.contract.fusion import LLAMA_DECODER, BlockFusion
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams

#: (fixture, where it is read from): every dense GGUF, and Mistral's HF folder (windowed)
#: (MoE models are left out: their graph never asks for the fusion, and rebuilding it here
#: without the loader's expert placement is not possible)
MOE = ("granitemoe", "glm4moe")
CASES = [(n, "gguf") for n, f in FIXTURES.items() if f.arch not in MOE] + [("mistral", "hf")]
PLAIN = {("llama-linear", "gguf"), ("mistral", "gguf")}

pytestmark = pytest.mark.skipif("torch" not in RUNTIME.backends(), reason="needs torch")


@pytest.mark.parametrize(("name", "source"), CASES)
def test_only_plain_blocks_reach_the_fusion(name, source):
    f = FIXTURES[name]
    model = load(f.gguf if source == "gguf" else f.hf_dir, "torch")
    handed = []

    def spy(backend, x, block, *rest):
        handed.append(block)
        return None  # decline: the graph runs the block's ops

    model.backend.use_fusions({("torch", LLAMA_DECODER): BlockFusion("torch", LLAMA_DECODER, spy)})
    model.graph = model.arch.build(model.config, model.weights, model.backend)
    ctx = Context(model, ContextParams(n_ctx=32))
    prompt = np.arange(5)
    ctx.decode(Batch.for_sequence(prompt, logits="none"))
    ctx.decode(Batch.for_sequence(np.array([7]), start_pos=len(prompt), logits="all"))
    assert len(handed) == (model.config.n_layer if (name, source) in PLAIN else 0)

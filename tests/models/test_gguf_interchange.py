"""tessera's GGUF files read by an independent GGUF loader (transformers' ``gguf_file=``).

transformers follows llama.cpp's layout when it reads GGUF (metadata keys, tensor names,
un-permuting the ``llama`` arch's Q/K rows), so equal logits here mean tessera's files mean
the same thing to another implementation as they do to tessera, for every quant type
transformers can dequantize.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf

RUNTIME = Runtime()
PROMPT = [5, 17, 99, 3, 250, 11, 42, 7]
# transformers' GGUF reader takes Qwen3's head_dim from its config default (128).
DIMS = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 128}}
# max abs logit difference (logits have std ~0.16); quantized files are dequantized
# identically on both sides, so only float arithmetic order differs.
TOLERANCE = 1e-5


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("arch", sorted(DIMS))
def test_transformers_reads_tessera_gguf_to_the_same_logits(tmp_path, arch, qtype):
    dims = {"n_embd": 64, "n_ff": 128} if qtype == "f32" else {"n_embd": 128, "n_ff": 256}
    path = make_gguf(tmp_path / f"{arch}.gguf", arch, qtype=qtype, **dims, **DIMS[arch])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].numpy()

    model = load_model(path, RUNTIME, "numpy")
    ctx = Context(model, ContextParams(n_ctx=64))
    got = ctx.decode(Batch.for_sequence(PROMPT, logits="all"))
    assert np.abs(got - want).max() < TOLERANCE * max(1.0, np.abs(want).max())

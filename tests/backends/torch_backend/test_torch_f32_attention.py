"""Prefill attention in float32 on the bf16 backend (``TESSERA_TORCH_F32_ATTENTION=1``):
its choice, and SDPA's result equal to the float32 backend's on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tessera.backends.torch.activations import choose_attention
from tessera.plugin_manager import Runtime

RUNTIME = Runtime()


def _backend(dtype: str):
    return RUNTIME.create_backend("torch", device="cpu", dtype=dtype)


def test_the_choice_and_its_record(monkeypatch):
    assert choose_attention(torch.float32, torch.bfloat16) == (
        "bf16",
        "off unless TESSERA_TORCH_F32_ATTENTION=1",
    )
    monkeypatch.setenv("TESSERA_TORCH_F32_ATTENTION", "1")
    assert choose_attention(torch.float32, torch.bfloat16).path == "f32"
    # with bf16 activations there is no float32 input to keep
    assert choose_attention(torch.bfloat16, torch.bfloat16).path == "bf16"
    b = _backend("bf16")
    assert b.paths["prefill attention"].path == "f32" and b.attn_dtype == torch.float32


def _inputs(n_tokens: int, n_kv: int, seed: int):
    rng = np.random.default_rng(seed)
    q = torch.from_numpy(rng.standard_normal((n_tokens, 4, 32)).astype(np.float32))
    k, v = (torch.from_numpy(rng.standard_normal((64, 2, 32)).astype(np.float32)) for _ in "kv")
    # a causal mask over a cache that already holds n_kv - n_tokens cells
    mask = np.tri(n_tokens, n_kv, n_kv - n_tokens, dtype=bool)
    return q, k, v, mask


@pytest.mark.parametrize("n_tokens,n_kv", [(16, 16), (12, 40)])
def test_float32_sdpa_equals_the_float32_backend(monkeypatch, n_tokens, n_kv):
    q, k, v, mask = _inputs(n_tokens, n_kv, seed=n_kv)
    reference = _backend("f32").attention(q, k, v, n_kv, mask, 0.125)
    rounded = _backend("bf16").attention(q, k.bfloat16(), v.bfloat16(), n_kv, mask, 0.125)
    monkeypatch.setenv("TESSERA_TORCH_F32_ATTENTION", "1")
    b = _backend("bf16")
    got = b.attention(q, k, v, n_kv, mask, 0.125)  # float32 caches (-ctk f32 -ctv f32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, reference, rtol=1e-6, atol=1e-6)
    assert (rounded.float() - reference).abs().max() > 100 * (got - reference).abs().max()
    # bf16 caches: the values widened exactly, so the same as float32 caches of them
    widened = _backend("f32").attention(q, k.bfloat16().float(), v.bfloat16().float(), n_kv,
                                        mask, 0.125)  # fmt: skip
    got16 = b.attention(q, k.bfloat16(), v.bfloat16(), n_kv, mask, 0.125)
    torch.testing.assert_close(got16, widened, rtol=1e-6, atol=1e-6)


def test_with_float32_prefill_matmuls_a_model_matches_the_float32_backend(tmp_path, monkeypatch):
    """F16 weights, float32 prefill matmuls, float32 SDPA and a float32 cache: every op of a
    prompt's forward in float32, so the logits are the float32 backend's (the rows path)."""
    from tessera.engine.batch import Batch
    from tessera.engine.context import Context, ContextParams
    from tessera.files.load import load_model
    from tessera.testing import make_gguf

    path = make_gguf(tmp_path / "f16.gguf", "llama", qtype="f16", seed=3)
    tokens = np.random.default_rng(0).integers(0, 200, 40)

    def logits(dtype: str, **kv: str) -> np.ndarray:
        model = load_model(path, RUNTIME, "torch", dtype=dtype)
        ctx = Context(model, ContextParams(n_ctx=64, n_batch=64, n_ubatch=64, **kv))
        assert ctx.kv_path == "rows"
        return ctx.decode(Batch.for_sequence(tokens, logits="all"))

    want = logits("f32")
    monkeypatch.setenv("TESSERA_TORCH_F32_PREFILL", "1")
    default_attention = logits("bf16", type_k="f32", type_v="f32")
    monkeypatch.setenv("TESSERA_TORCH_F32_ATTENTION", "1")
    got = logits("bf16", type_k="f32", type_v="f32")
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 1e-5 * scale
    assert np.abs(default_attention - want).max() > 10 * np.abs(got - want).max()

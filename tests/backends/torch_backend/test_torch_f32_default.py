"""The float32 default of CPUs without fast bf16 units (AVX2 laptops, CPUs without
AVX512-BF16 or AMX; ``TESSERA_TORCH_FAST_BF16=0`` makes this machine one): the native kernels
serve it, rounding activations to int8 blocks for quantized weights as llama.cpp does, while
float32 asked for by name (``dtype="f32"``, ``TESSERA_TORCH_DTYPE=f32``) keeps the exact
torch paths.

The oracle is the exact float32 run of the same file; the bf16 default of a CPU with fast
bf16 (int8 activations too, plus bf16 rounding) gives the scale of an acceptable deviation.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.native import library
from tessera.backends.native import probe as native_probe
from tessera.backends.torch import backend as torch_backend
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import SwitchValueError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf

RUNTIME = Runtime()
N_PROMPT, N_DECODE = 24, 4  # 24 prompt rows: prefill on the int8 GEMM (16 rows or more)


@pytest.fixture
def no_fast_bf16(monkeypatch):
    """This machine as a CPU without fast bf16 units and without AMX."""
    monkeypatch.delenv("TESSERA_TORCH_DTYPE", raising=False)
    monkeypatch.setenv(torch_backend.FAST_BF16.name, "0")
    monkeypatch.setenv(library.AMX_DISABLE_ENV, "1")


def test_the_switch_forces_the_cpus_answer(monkeypatch):
    for value, fast in (("1", True), ("0", False)):
        monkeypatch.setenv(torch_backend.FAST_BF16.name, value)
        assert torch_backend.cpu_has_fast_bf16() is fast
    monkeypatch.setenv(torch_backend.FAST_BF16.name, "fast")
    with pytest.raises(SwitchValueError, match="TESSERA_TORCH_FAST_BF16"):
        torch_backend.cpu_has_fast_bf16()


def test_f32_by_default_is_not_exact_f32_by_name_is(no_fast_bf16, monkeypatch):
    default = RUNTIME.create_backend("torch", device="cpu")
    assert default.dtype == "f32" and not default.exact_f32
    assert default.paths["compute dtype"] == (
        "f32",
        "no fast bf16 units (TESSERA_TORCH_FAST_BF16=0): f32 with the native kernels",
    )
    asked = RUNTIME.create_backend("torch", device="cpu", dtype="f32")
    assert asked.exact_f32
    assert asked.paths["compute dtype"] == ("f32", "asked for: the exact torch paths")
    assert "keeps the exact torch paths" in native_probe.status(asked).reason
    monkeypatch.setenv("TESSERA_TORCH_DTYPE", "f32")
    assert RUNTIME.create_backend("torch", device="cpu").exact_f32
    monkeypatch.setenv(torch_backend.FAST_BF16.name, "1")
    monkeypatch.delenv("TESSERA_TORCH_DTYPE")
    assert RUNTIME.create_backend("torch", device="cpu").dtype == "bf16"


@pytest.fixture(scope="module", params=["q8_0", "q4_0", "q4_k", "f16"])
def model_path(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return make_gguf(
        folder / "m.gguf", "qwen2", qtype=request.param, seed=5, n_embd=256, n_layer=4,
        n_head=4, n_head_kv=2, n_ff=512,
    )  # fmt: skip


def run_logits(path, dtype):
    """Prefill logits of every prompt row and a few greedy decode steps' logits (the greedy
    tokens the exact run chose, so every run sees the same inputs), and the model."""
    model = load_model(path, RUNTIME, "torch", device="cpu", dtype=dtype)
    ctx = Context(model, ContextParams(n_ctx=64))
    prompt = (np.arange(N_PROMPT) * 37 + 5) % model.config.n_vocab
    prefill = np.asarray(ctx.decode(Batch.for_sequence(prompt, logits="all")), np.float64)
    steps = []
    for i in range(N_DECODE):
        token = np.array([(i * 11 + 3) % model.config.n_vocab])
        batch = Batch.for_sequence(token, start_pos=N_PROMPT + i, logits="all")
        steps.append(np.asarray(ctx.decode(batch), np.float64)[-1])
    return np.concatenate([prefill, np.stack(steps)]), model


def test_the_native_kernels_serve_it_within_the_bf16_paths_error(native, no_fast_bf16, model_path):
    # (the native fixture fails where the kernels should exist but do not)
    assert native_probe.probe(RUNTIME.create_backend("torch", device="cpu")) is not None
    exact, exact_model = run_logits(model_path, "f32")
    fast, model = run_logits(model_path, None)
    paths = model.backend.paths
    assert exact_model.backend.paths["native kernels"].path == "torch"
    assert model.backend.dtype == "f32" and paths["native kernels"].path == "native"
    assert paths["native VNNI prefill GEMM"].path == "on"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(torch_backend.FAST_BF16.name, "1")
        bf16, _ = run_logits(model_path, None)
    fast_err, bf16_err = np.abs(fast - exact).max(axis=1), np.abs(bf16 - exact).max(axis=1)
    assert fast_err.max() > 0  # the int8 paths ran, not the exact ones
    assert np.all(fast_err <= 1.5 * bf16_err + 1e-3 * np.abs(exact).max(axis=1))
    assert np.mean(fast.argmax(axis=1) == exact.argmax(axis=1)) >= 0.9


def test_16_bit_weights_stay_in_the_file_and_f32_asked_for_widens_them(no_fast_bf16, tmp_path):
    import torch

    path = make_gguf(tmp_path / "m.gguf", "qwen2", qtype="f16", seed=1, n_embd=64, n_layer=1)
    default = load_model(path, RUNTIME, "torch", device="cpu", dtype=None).weights
    exact = load_model(path, RUNTIME, "torch", device="cpu", dtype="f32").weights
    name = "blk.0.ffn_up.weight"
    assert default[name].dtype == torch.float16 and exact[name].dtype == torch.float32
    assert torch.equal(default[name].float(), exact[name])

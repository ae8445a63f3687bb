"""bf16 on the CPU with float32 activations (``TESSERA_TORCH_F32_ACTIVATIONS``): logits
closer to the float32 run of the same weights than the path that rounds every activation
to bf16, at prefill (torch's bf16 matmuls, SDPA) and at decode (the native kernels).

The oracle is the torch backend in float32 on the same file: bf16 weights are exact in
float32, so what differs between the runs is only how the activations are rounded.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.models import make_gguf

RUNTIME = Runtime()
pytestmark = pytest.mark.skipif("torch" not in RUNTIME.backends(), reason="needs torch")
N_PROMPT, N_DECODE = 24, 4


@pytest.fixture(scope="module", params=["bf16", "q8_0"])
def model_path(request, tmp_path_factory):
    # qwen2: Q/K/V biases (the native matmuls and the decoder block take float32 copies)
    folder = tmp_path_factory.mktemp(request.param)
    return make_gguf(
        folder / "m.gguf", "qwen2", qtype=request.param, seed=3, n_embd=128, n_layer=4,
        n_head=4, n_head_kv=2, n_ff=256,
    )  # fmt: skip


def run_logits(path, dtype: str) -> tuple[np.ndarray, np.ndarray, Any]:
    """Prefill logits of every prompt row, the logits of a few greedy decode steps, and the
    model (its backend's activation path; its residual stream before the final norm)."""
    model = load_model(path, RUNTIME, "torch", device="cpu", dtype=dtype)
    model.graph.hidden_sink = []
    ctx = Context(model, ContextParams(n_ctx=64))
    prompt = (np.arange(N_PROMPT) * 37 + 5) % model.config.n_vocab
    prefill = np.asarray(ctx.decode(Batch.for_sequence(prompt, logits="all")), np.float64)
    steps, token = [], int(prefill[-1].argmax())
    for i in range(N_DECODE):
        batch = Batch.for_sequence(np.array([token]), start_pos=N_PROMPT + i, logits="all")
        row = np.asarray(ctx.decode(batch), np.float64)[-1]
        steps.append(row)
        token = int(row.argmax())
    return prefill, np.stack(steps), model


@pytest.fixture(scope="module")
def runs(model_path):
    """The float32 reference, bf16 with float32 activations, bf16 with bf16 activations."""
    with pytest.MonkeyPatch.context() as mp:
        ref = run_logits(model_path, "f32")
        mp.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "1")
        new = run_logits(model_path, "bf16")
        mp.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "0")
        old = run_logits(model_path, "bf16")
    return ref, new, old


def test_float32_activations_are_closer_to_float32_than_bf16_activations(runs, model_path):
    ref, new, old = runs
    paths = [run[2].backend.paths["activations"].path for run in runs]
    assert paths == ["f32", "f32", "bf16"]
    # prefill (torch matmuls, the AMX tiles, SDPA) and decode (the native kernels) alike;
    # what both bf16 paths share (weights and matmul inputs in bf16; Q8_0's GEMV quantizes
    # its input to int8) bounds the gain, most on Q8_0's decode
    bound = 0.75 if "bf16" in model_path.parent.name else 0.9
    for i in (0, 1):
        err_new, err_old = np.abs(new[i] - ref[i]).mean(), np.abs(old[i] - ref[i]).mean()
        assert err_new < bound * err_old, (i, err_new, err_old)


def test_the_residual_stream_is_float32_unless_switched_off(runs):
    _, new, old = runs
    for run, held in ((new, "torch.float32"), (old, "torch.bfloat16")):
        h = run[2].graph.hidden_sink[-1]
        assert str(h.dtype) == held
        exact = (h.float() == h.bfloat16().float()).float().mean().item()
        assert exact == 1.0 if held == "torch.bfloat16" else exact < 0.1


def test_the_switch_off_keeps_every_activation_in_bf16(model_path, monkeypatch):
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "0")
    backend = load_model(model_path, RUNTIME, "torch", device="cpu", dtype="bf16").backend
    rows = backend.get_rows(backend.from_numpy(np.ones((4, 8), np.float32)), np.array([1, 2]))
    assert str(backend.act_dtype) == str(rows.dtype) == "torch.bfloat16"
    assert backend.paths["activations"].reason == "disabled by TESSERA_TORCH_F32_ACTIVATIONS=0"


def test_float32_activations_leave_weights_in_bf16(model_path, monkeypatch):
    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "1")
    model = load_model(model_path, RUNTIME, "torch", device="cpu", dtype="bf16")
    embd = model.weights["token_embd.weight"]
    assert str(model.backend.act_dtype) == "torch.float32"
    if hasattr(embd, "dtype"):  # a plain tensor (BF16 file): held in the compute dtype
        assert str(embd.dtype) == "torch.bfloat16"
    rows = model.backend.get_rows(embd, np.array([0, 3]))
    assert str(rows.dtype) == "torch.float32"  # rows enter the residual stream in float32


def test_a_swiglu_of_bf16_matmuls_forms_its_product_in_bf16(monkeypatch):
    """Float32 activations, K-quant weights at prefill rows (dequantized, multiplied in
    bf16: no AMX tiles or GEMV take them): gate and up come back in bf16 and their product is
    formed there, the down projection's input, with no float32 round trip."""
    import torch
    import torch.nn.functional as F

    from tessera.files.gguf import RawTensor

    monkeypatch.setenv("TESSERA_TORCH_F32_ACTIVATIONS", "1")
    b = RUNTIME.create_backend("torch", device="cpu", dtype="bf16")
    RUNTIME.equip(b)
    qt = RUNTIME.quant_type_by_name("Q4_K")
    rng = np.random.default_rng(10)
    ws, dense = [], []
    for name in ("gate", "up"):
        data = qt.quantize_tensor(rng.standard_normal((64, 256)).astype(np.float32))
        ws.append(
            b.load_weight(RawTensor(f"blk.0.ffn_{name}.weight", qt.ggml_type, (64, 256), data), qt)
        )
        dense.append(qt.dequantize_tensor(data, (64, 256)).astype(np.float64))
    x = torch.from_numpy(rng.standard_normal((40, 256)).astype(np.float32))
    assert b._tiles_of(ws[0], 40) is None and b._native_gemv(ws[0], 40) is None
    y = b.gate_up_swiglu(x, *ws)
    xb = x.bfloat16()
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, F.silu(b._matmul(xb, ws[0])) * b._matmul(xb, ws[1]))
    gate, up = x.double().numpy() @ dense[0].T, x.double().numpy() @ dense[1].T
    want = gate / (1 + np.exp(-gate)) * up
    assert np.abs(y.double().numpy() - want).max() <= 0.05 * np.abs(want).max()

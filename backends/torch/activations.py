"""The torch backend's activation dtype: the dtype of the tensors that flow between ops
(residual stream, norm outputs, attention and FFN outputs, logits), which may differ from
the compute dtype that weights are held in.

With bf16 on the CPU activations are float32 (``TESSERA_TORCH_F32_ACTIVATIONS``, on by
default) and each matmul's input is rounded to bf16 where the kernel multiplies in bf16
(the AMX tiles, torch's oneDNN matmuls, SDPA over a bf16 KV cache), as llama.cpp keeps
float32 activations and converts only a matmul's input to the weight's type; the native
decode kernels and the int8 VNNI GEMM take float32 inputs and return float32 sums
unrounded. Rounding every activation to bf16 instead (``=0``) gives a mean KL divergence
against float32 about six times as high on the bundled model (docs/performance.md), for
7-10% more prefill speed on an AMX CPU and about none without AMX.
"""

from __future__ import annotations

import torch

from tessera.backends.torch.backend import F32_ACTIVATIONS, F32_ATTENTION
from tessera.switches import Choice, choose

#: The name of each compute dtype, as ``--dtype`` and the recorded paths spell it.
DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def choose_activations(device: torch.device, dtype: torch.dtype) -> Choice:
    """``Choice(path, why)``: ``"f32"`` where bf16 CPU compute keeps float32 activations,
    else the compute dtype's name (``"bf16"``, ``"f16"``, ``"f32"``)."""
    name = DTYPE_NAMES[dtype]
    if dtype == torch.float32:
        return Choice("f32", "the compute dtype is float32")

    def probe() -> tuple[bool, str]:
        if dtype != torch.bfloat16 or device.type != "cpu":
            return False, f"only for bf16 on CPU (this is {device.type}/{name})"
        return True, "float32 between ops; matmul inputs rounded to bf16"

    return choose(F32_ACTIVATIONS, probe, on="f32", off=name)


def choose_attention(act_dtype: torch.dtype, dtype: torch.dtype) -> Choice:
    """``Choice(path, why)``: ``"f32"`` where SDPA (prefill attention) runs in float32 over
    float32 activations of a 16-bit compute dtype (``TESSERA_TORCH_F32_ATTENTION=1``), else
    the compute dtype's name. The native decode attention sums in float32 either way."""
    name = DTYPE_NAMES[dtype]

    def probe() -> tuple[bool, str]:
        if act_dtype == dtype:
            return False, f"activations in the compute dtype ({name})"
        return True, "float32 SDPA: q unrounded, K/V widened"

    return choose(F32_ATTENTION, probe, on="f32", off=name)


def to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` (``x`` itself when it already is)."""
    return x if x.dtype == dtype else x.to(dtype)

"""Pre-packed dense-layer weights for the torch backend's ``linear`` op (CPU, bf16 / f16).

torch runs a bf16 or f16 matmul on the CPU through oneDNN, which reorders the weight into
its blocked (AMX / AVX-512) layout on every call. With few rows (an encoder embedding one
sentence: ~30 tokens) that reorder costs as much as the multiply itself. Here each weight
is reordered once, at its first use (``torch.ops.mkldnn._reorder_linear_weight``), and the
op runs ``torch.ops.mkldnn._linear_pointwise`` on the packed copy: the same oneDNN kernel,
bit-identical output, ~25-30% less time per call from 29 to 1500 rows (MiniLM shapes, one
thread, AMX CPU). float32 stays on torch's default (MKL) path, where packing gained little.
The op's ``activation`` (GELU) or ``residual`` add runs as a oneDNN post-op on the float32
accumulator (rounded once; ~30-45 us less per call than a separate torch op at 29 rows).

A probe checks the ops exist and agree with ``F.linear`` on a small input; where it says
no, or ``TESSERA_TORCH_PACKED_LINEAR=0``, ``linear`` keeps ``F.linear``. Packed copies are
kept beside the loaded weights (the model's weight dict still holds the originals), so a
model whose dense layers run through ``linear`` holds those weights twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tessera.backends.torch.backend import PACKED_LINEAR
from tessera.switches import Choice, choose

#: Compute dtypes whose CPU matmul is oneDNN's (float32 goes to MKL).
PACKED_DTYPES = (torch.bfloat16, torch.float16)


def choose_packed_linear(backend: Any) -> Choice:
    """``(True, why)`` where pre-packed weights serve ``backend``'s ``linear``, else
    ``(False, why not)``: ``TESSERA_TORCH_PACKED_LINEAR=0`` or the probe."""
    return choose(PACKED_LINEAR, lambda: packed_linear_probe(backend))


def packed_linear_probe(backend: Any) -> tuple[bool, str]:
    """Whether pre-packed weights can serve ``backend``'s ``linear``, and why (or why not)."""
    if backend.torch_device.type != "cpu" or backend.torch_dtype not in PACKED_DTYPES:
        return False, f"only for bf16/f16 on CPU (this is {backend.device}/{backend.dtype})"
    ops = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available():
        return False, "torch built without oneDNN"
    gen = torch.Generator().manual_seed(0)
    dt = backend.torch_dtype
    x = torch.randn(7, 64, generator=gen).to(dt)
    w = (torch.randn(48, 64, generator=gen) / 8).to(dt)
    bias = torch.randn(48, generator=gen).to(dt)
    res = torch.randn(7, 48, generator=gen).to(dt)
    try:
        packed = ops._reorder_linear_weight(w, None)
        got = [
            ops._linear_pointwise(x, packed, bias, "none", [], ""),
            ops._linear_pointwise(x, packed, bias, "gelu", [], "none"),
            ops._linear_pointwise(x, packed, bias, "gelu", [], "tanh"),
            ops._linear_pointwise.binary(x, res, packed, bias, "add"),
        ]
    except (AttributeError, RuntimeError) as exc:
        return False, f"oneDNN packing unavailable ({type(exc).__name__})"
    y = F.linear(x.float(), w.float(), bias.float())
    want = [y, F.gelu(y), F.gelu(y, approximate="tanh"), y + res.float()]
    for g, ref in zip(got, want, strict=True):
        if g.dtype != dt or not torch.allclose(g.float(), ref, rtol=2e-2, atol=2e-2):
            return False, "packed oneDNN linear disagrees with F.linear on the probe input"
    return True, "oneDNN weights reordered once, not per call; gelu / residual add fused"


#: ``linear`` activations -> (oneDNN post-op, its algorithm) and the eager op.
_ACTIVATIONS = {
    "gelu": ("gelu", "tanh", lambda y: F.gelu(y, approximate="tanh")),
    "gelu_erf": ("gelu", "none", F.gelu),
}


def epilogue(y: torch.Tensor, activation: str, residual: torch.Tensor | None) -> torch.Tensor:
    """``activation(y) + residual`` with eager ops (what the packed path fuses)."""
    if activation:
        y = _ACTIVATIONS[activation][2](y)
    return y if residual is None else y + residual


class PackedLinear:
    """``linear`` on packed copies of plain weight tensors, made on first use; the
    activation or the residual add runs as a oneDNN post-op (one of them per call)."""

    def __init__(self, backend: Any) -> None:
        self.ok, self.reason = choose_packed_linear(backend)
        backend.record("linear weights", "packed" if self.ok else "F.linear", self.reason)
        # id(weight) -> (weight, packed): the weight is kept so its id is not reused
        self._packed: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        bias: torch.Tensor,
        activation: str = "",
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.ok or x.dim() != 2 or x.dtype != w.dtype or bias.dtype != w.dtype:
            return epilogue(F.linear(x, w, bias), activation, residual)
        hit = self._packed.get(id(w))
        if hit is None:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None)
            hit = self._packed[id(w)] = (w, packed)
        x = x.contiguous()
        # the overloads themselves: calling the packet would match the schema every call
        ops = torch.ops.mkldnn._linear_pointwise
        if activation:
            post, algorithm, _ = _ACTIVATIONS[activation]
            y = ops.default(x, hit[1], bias, post, [], algorithm)
            return y if residual is None else y + residual
        if residual is not None and residual.dtype == x.dtype:
            return ops.binary(x, residual.contiguous(), hit[1], bias, "add")
        return epilogue(ops.default(x, hit[1], bias, "none", [], ""), "", residual)

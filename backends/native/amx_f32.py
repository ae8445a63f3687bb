"""AMX tile matmuls with float32 outputs, for float32 activations: ``x`` rounded to bf16,
the weight dequantized to bf16 tiles (Q4_0, Q8_0) or read as it is (a BF16 tensor), the
products summed in float32 and returned unrounded (``tsr_matmul_amx_f32`` and
``tsr_swiglu_amx_f32`` of ``native_amx.c``). The bf16-output kernels
(:meth:`~tessera.backends.native.kernels.NativeGemv.matmul_tiles`) stay as they are.
"""

from __future__ import annotations

from typing import Any

from tessera.backends.native.kernels import TILE_TYPE_SIZES


def tiles_f32(native: Any, kind: str, ws: tuple[Any, ...], x: Any, out_f32: bool = True) -> Any:
    """``x @ W.T`` (one weight) or ``silu(x @ W_gate.T) * (x @ W_up.T)`` (two of one shape)
    as a float32 ``(T, n_out)`` tensor (bfloat16, rounded once, without ``out_f32``), ``x``
    a ``(T, n_in)`` bfloat16 CPU tensor, ``ws`` block bytes of ``kind`` or contiguous
    bfloat16 tensors for ``"BF16"``; None where the tiles do not serve (no AMX, too few
    rows, a shape or kind they do not take)."""
    import torch

    if kind not in TILE_TYPE_SIZES or (len(ws) == 2 and ws[0].shape != ws[1].shape):
        return None
    if kind == "BF16" and not all(w.dtype == torch.bfloat16 and w.is_contiguous() for w in ws):
        return None
    lib = native.lib
    if out_f32:
        fn = lib.tsr_matmul_amx_f32 if len(ws) == 1 else lib.tsr_swiglu_amx_f32
    else:
        fn = lib.tsr_matmul_amx if len(ws) == 1 else lib.tsr_swiglu_amx
    out_dtype = torch.float32 if out_f32 else torch.bfloat16
    return native._tiles(fn, kind, ws, x, 32 if len(ws) == 1 else 16, out_dtype)

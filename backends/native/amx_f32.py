"""Prefill matmuls with float32 outputs, for float32 activations. On the AMX tiles: ``x``
rounded to bf16, the weight dequantized to bf16 tiles (Q4_0, Q8_0), read as it is (a BF16
tensor) or rounded to bf16 block by block (an F16 tensor), the products summed in float32
and returned unrounded (``tsr_matmul_amx_f32`` and ``tsr_swiglu_amx_f32`` of
``native_amx.c``). Where the tiles are off, the int8 VNNI GEMM
(:meth:`~tessera.backends.native.vnni_gemm.VnniGemm.matmul_vnni`) takes the float32 ``x``
as it is (quantized to int8 blocks, as for any dtype) and writes float32. The bf16-output
kernels (:meth:`~tessera.backends.native.kernels.NativeGemv.matmul_tiles`) stay as they are.
"""

from __future__ import annotations

from typing import Any

from tessera.backends.native.kernels import TILE_TYPES

#: The torch dtype of each dense kind's tensors.
DENSE_TILE_DTYPES = {"BF16": "bfloat16", "F16": "float16"}


def tiles_f32(native: Any, kind: str, ws: tuple[Any, ...], x: Any, out_f32: bool = True) -> Any:
    """``x @ W.T`` (one weight) or ``silu(x @ W_gate.T) * (x @ W_up.T)`` (two of one shape)
    as a float32 ``(T, n_out)`` tensor (bfloat16, rounded once, without ``out_f32``), ``x``
    a ``(T, n_in)`` float32 or bfloat16 CPU tensor, ``ws`` block bytes of ``kind`` or
    contiguous bfloat16 / float16 tensors for ``"BF16"`` / ``"F16"``; None where neither the
    tiles nor the VNNI GEMM serve (too few rows, a shape or kind they do not take)."""
    import torch

    out_dtype = torch.float32 if out_f32 else torch.bfloat16
    dense = DENSE_TILE_DTYPES.get(kind)
    if not native.amx:
        if dense:
            return None
        return native.matmul_vnni(kind, ws, x, out_dtype, compute_dtype=torch.bfloat16)
    if kind not in TILE_TYPES or (len(ws) == 2 and ws[0].shape != ws[1].shape):
        return None
    if dense and not all(w.dtype == getattr(torch, dense) and w.is_contiguous() for w in ws):
        return None
    x = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    lib = native.lib
    if out_f32:
        fn = lib.tsr_matmul_amx_f32 if len(ws) == 1 else lib.tsr_swiglu_amx_f32
    else:
        fn = lib.tsr_matmul_amx if len(ws) == 1 else lib.tsr_swiglu_amx
    return native._tiles(fn, kind, ws, x, 32 if len(ws) == 1 else 16, out_dtype)

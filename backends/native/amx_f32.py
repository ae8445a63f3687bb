"""AMX tile matmuls with float32 outputs, for float32 activations: ``x`` rounded to bf16,
the weight dequantized to bf16 tiles (Q4_0, Q8_0) or read as it is (a BF16 tensor), the
products summed in float32 and returned unrounded (``tsr_matmul_amx_f32`` and
``tsr_swiglu_amx_f32`` of ``native_amx.c``). The bf16-output kernels
(:meth:`~tessera.backends.native.kernels.NativeGemv.matmul_tiles`) stay as they are.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: Bytes per 32 weights of each weight kind the tiles read (BF16: 32 values, 64 bytes).
TILE_TYPE_SIZES = {"Q4_0": 18, "Q8_0": 34, "BF16": 64}


def _declare(lib: Any) -> None:
    """The two entry points' C signatures, set once per library."""
    if getattr(lib, "_amx_f32_declared", False):
        return
    # (type size, weight(s), n_out, n_in, x, rows, y, scratch, threads)
    after = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    after += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.tsr_matmul_amx_f32.argtypes = [ctypes.c_int, ctypes.c_void_p] + after
    lib.tsr_swiglu_amx_f32.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + after
    lib.tsr_matmul_amx_f32.restype = lib.tsr_swiglu_amx_f32.restype = ctypes.c_int
    lib._amx_f32_declared = True


def tiles_f32(native: Any, kind: str, ws: tuple[Any, ...], x: Any, out_f32: bool = True) -> Any:
    """``x @ W.T`` (one weight) or ``silu(x @ W_gate.T) * (x @ W_up.T)`` (two of one shape)
    as a float32 ``(T, n_out)`` tensor (bfloat16, rounded once, without ``out_f32``), ``x``
    a ``(T, n_in)`` bfloat16 CPU tensor, ``ws`` block bytes of ``kind`` or contiguous
    bfloat16 tensors for ``"BF16"``; None where the tiles do not serve (no AMX, too few
    rows, a shape or kind they do not take)."""
    import torch

    n_out = ws[0].shape[0]
    multiple = 32 if len(ws) == 1 else 16
    if kind not in TILE_TYPE_SIZES or not native.tiles_serve(x.shape[0], n_out, x.dtype, multiple):
        return None
    if len(ws) == 2 and ws[0].shape != ws[1].shape:
        return None
    if kind == "BF16" and not all(w.dtype == torch.bfloat16 and w.is_contiguous() for w in ws):
        return None
    _declare(native.lib)
    x = x.contiguous()
    n_rows, n_in = x.shape
    threads = native._threads()
    need = threads * native.lib.tsr_amx_scratch_bytes(n_in) + 64
    if native._amx_scratch is None or native._amx_scratch.numel() < need:
        native._amx_scratch = torch.empty(need, dtype=torch.uint8)  # shared with matmul_tiles
    aligned = -native._amx_scratch.data_ptr() % 64
    y = torch.empty((n_rows, n_out), dtype=torch.float32 if out_f32 else torch.bfloat16)
    lib = native.lib
    if out_f32:
        fn = lib.tsr_matmul_amx_f32 if len(ws) == 1 else lib.tsr_swiglu_amx_f32
    else:
        fn = lib.tsr_matmul_amx if len(ws) == 1 else lib.tsr_swiglu_amx
    done = fn(
        TILE_TYPE_SIZES[kind], *(w.data_ptr() for w in ws), n_out, n_in, x.data_ptr(), n_rows,
        y.data_ptr(), native._amx_scratch.data_ptr() + aligned, threads,
    )  # fmt: skip
    return y if done else None

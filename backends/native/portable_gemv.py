"""The portable decode GEMV (``native_qgemv_portable.c``: plain C loops, no intrinsics) as a
method that :class:`~tessera.backends.native.kernels.NativeGemv` inherits; it serves the
quantized decode matmuls when ``TESSERA_NATIVE_PATH=portable`` forces that path
(:mod:`tessera.backends.native.cpu_paths`). Same arithmetic as the vector kernels: int8
activation blocks of 32, one integer dot product per weight group of 16, float32 scales.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: GGML type numbers of the block types the portable GEMV multiplies.
PORTABLE_TYPES = {
    "Q8_0": 8, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "IQ4_NL": 20, "Q4_K": 12,
    "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ2_S": 22, "IQ3_XXS": 18,
    "IQ3_S": 21, "IQ1_S": 19, "IQ1_M": 29,
}  # fmt: skip
#: Weights in one call (PMAX_WEIGHTS in the C file).
MAX_PORTABLE_WEIGHTS = 8


def declare_portable(lib: Any) -> None:
    """The ctypes signatures of the portable GEMV and of ``tsr_native_isa``."""
    args = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_gemv_quant_portable.argtypes = args
    lib.tsr_gemv_quant_portable.restype = ctypes.c_int
    lib.tsr_portable_block.argtypes, lib.tsr_portable_block.restype = [ctypes.c_int], ctypes.c_int
    lib.tsr_native_isa.argtypes, lib.tsr_native_isa.restype = [], ctypes.c_int


class PortableGemv:
    """The portable kernel of a loaded library (``self.lib``, ``self._empty``,
    ``self._dtypes``, ``self._threads`` are set by ``NativeGemv``)."""

    lib: Any
    _empty: Any
    _dtypes: dict[Any, int]
    _threads: Any

    def gemv_portable(
        self, kind: str, ws: tuple[Any, ...], x: Any, biases: tuple[Any, ...] | None = None
    ) -> Any:
        """``x`` ``(T, n_in)`` (float32/bfloat16/float16, CPU) times the ``kind`` weights
        ``ws`` (a type of :data:`PORTABLE_TYPES`; uint8 block bytes ``(n_out, row bytes)``,
        contiguous, at most :data:`MAX_PORTABLE_WEIGHTS`), each plus its bias (None or a
        contiguous tensor of ``x``'s dtype): ``(T, sum n_out)`` in ``x``'s dtype."""
        if kind not in PORTABLE_TYPES:
            raise ValueError(f"no portable {kind} matmul; types: {', '.join(PORTABLE_TYPES)}")
        if not x.is_contiguous():
            x = x.contiguous()
        n = len(ws)
        biases = biases or (None,) * n
        ptrs = (ctypes.c_void_p * n)(*(w.data_ptr() for w in ws))
        n_outs = (ctypes.c_int64 * n)(*(w.shape[0] for w in ws))
        bias_ptrs = (ctypes.c_void_p * n)(*(None if b is None else b.data_ptr() for b in biases))
        y = self._empty((x.shape[0], sum(w.shape[0] for w in ws)), dtype=x.dtype)
        done = self.lib.tsr_gemv_quant_portable(
            PORTABLE_TYPES[kind], n, ptrs, n_outs, bias_ptrs, x.shape[1], x.data_ptr(),
            x.shape[0], y.data_ptr(), self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        if not done:
            raise ValueError(f"no portable {kind} matmul for {n} weights of {x.shape[1]} columns")
        return y

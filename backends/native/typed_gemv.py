"""Native decode matmuls and prefill dequantization of the block types other than Q4_0/Q8_0
(``native_qgemv.c``: Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, TQ1_0, TQ2_0 and the grid types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M),
as methods that
:class:`~tessera.backends.native.kernels.NativeGemv` inherits.

The C side takes a weight's GGML type number: the activation rows are rounded to int8
blocks of 32 (as for Q4_0/Q8_0), each weight row's groups meet them in integer dot products
on the file's bytes in place, scaled per group in float32. The dequantization gives, after
one rounding to the compute dtype, the values the numpy dequantization gives.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: GGML type numbers of the block types ``native_qgemv.c`` serves.
GGML_TYPES = {
    "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20,
    "IQ4_XS": 23, "TQ2_0": 35, "MXFP4": 39, "Q2_K": 10, "Q3_K": 11, "TQ1_0": 34, "NVFP4": 40,
    "IQ2_XXS": 16, "IQ2_XS": 17, "IQ2_S": 22, "IQ3_XXS": 18, "IQ3_S": 21, "IQ1_S": 19,
    "IQ1_M": 29,
}  # fmt: skip
#: The grid types among them (``native_qdot_iq.c``; tessera reads but does not write them).
GRID_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
#: Weights in one :meth:`TypedGemv.gemv_typed` call (QUANT_MAX_WEIGHTS in the C file).
MAX_TYPED_WEIGHTS = 8
#: Values of the largest dequantized weight :meth:`TypedGemv.dequantize_scratch` keeps a
#: buffer for (128 MiB in bf16); larger ones get fresh memory each time.
SCRATCH_MAX_VALUES = 1 << 26


class TypedGemv:
    """The block types' kernels of a loaded library (``self.lib``, ``self._empty``,
    ``self._dtypes``, ``self._threads`` are set by ``NativeGemv``)."""

    lib: Any
    _empty: Any
    _dtypes: dict[Any, int]
    _threads: Any

    def typed_serves(self, kind: str, n_in: int) -> bool:
        """Whether the library multiplies and dequantizes ``kind`` weights of ``n_in`` columns."""
        ggml = GGML_TYPES.get(kind)
        return ggml is not None and self.lib.tsr_quant_row_bytes(ggml, n_in) > 0

    def gemv_typed(
        self, kind: str, ws: tuple[Any, ...], x: Any, biases: tuple[Any, ...] | None = None
    ) -> Any:
        """``x`` ``(T, n_in)`` (float32/bfloat16/float16, CPU) times the ``kind`` weights ``ws``
        (uint8 block bytes ``(n_out, row bytes)``, contiguous; at most
        :data:`MAX_TYPED_WEIGHTS`, one ``n_in``), each plus its bias (None, or a contiguous
        tensor of ``x``'s dtype): ``(T, sum n_out)`` in ``x``'s dtype, the outputs side by
        side. The activations are quantized once and one parallel region covers every row."""
        if not x.is_contiguous():
            x = x.contiguous()
        n = len(ws)
        biases = biases or (None,) * n
        ptrs = (ctypes.c_void_p * n)(*(w.data_ptr() for w in ws))
        n_outs = (ctypes.c_int64 * n)(*(w.shape[0] for w in ws))
        bias_ptrs = (ctypes.c_void_p * n)(*(None if b is None else b.data_ptr() for b in biases))
        y = self._empty((x.shape[0], sum(w.shape[0] for w in ws)), dtype=x.dtype)
        done = self.lib.tsr_gemv_quant(
            GGML_TYPES[kind], n, ptrs, n_outs, bias_ptrs, x.shape[1], x.data_ptr(), x.shape[0],
            y.data_ptr(), self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        if not done:
            raise ValueError(f"no native {kind} matmul for {n} weights of {x.shape[1]} columns")
        return y

    def dequantize_typed(self, kind: str, w: Any, dtype: Any, scratch: bool = False) -> Any:
        """The ``kind`` weight ``w`` (uint8 block bytes ``(n_out, row bytes)``, CPU) as a dense
        ``(n_out, n_in)`` tensor of ``dtype``: the numpy dequantization's values rounded once.
        With ``scratch``, in a buffer that the next such call overwrites (for a matmul that
        consumes the weight at once: prefill then faults in and zeroes no fresh 2 bytes per
        value each time, ~1 ms per 4864x896 weight)."""
        if kind not in GGML_TYPES:
            raise ValueError(f"no native dequantization for {kind}")
        if not w.is_contiguous():
            w = w.contiguous()
        row_bytes = self.lib.tsr_quant_row_bytes(GGML_TYPES[kind], 256)
        n_in = w.shape[1] * 256 // row_bytes
        n = w.shape[0] * n_in
        if scratch and n <= SCRATCH_MAX_VALUES:
            buffers = self.__dict__.setdefault("_dense_scratch", {})
            if dtype not in buffers or buffers[dtype].numel() < n:
                buffers[dtype] = self._empty(n, dtype=dtype)
            y = buffers[dtype][:n].view(w.shape[0], n_in)
        else:
            y = self._empty((w.shape[0], n_in), dtype=dtype)
        done = self.lib.tsr_dequant_quant(
            GGML_TYPES[kind], w.data_ptr(), w.shape[0], n_in, y.data_ptr(), self._dtypes[dtype],
            self._threads(),
        )  # fmt: skip
        if not done:
            raise MemoryError(f"the native {kind} dequantization could not allocate its buffers")
        return y

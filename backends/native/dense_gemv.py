"""Native decode matmuls of dense 16-bit weights (``native_dense_gemv.c``: F16 and BF16
rows, a few activation rows), as methods that
:class:`~tessera.backends.native.kernels.NativeGemv` inherits.

torch's one-row bf16 matmul read a weight at 3-5 GB/s, a fraction of the memory bandwidth,
so F16 files decoded at ~0.6x llama.cpp. The C kernel reads the weight rows one after the
other, each once for up to four activation rows, widens every value to float32 (exact) and
sums the products in float32 (``vdpbf16ps`` for bf16 activations and weights with
AVX512-BF16, FMA otherwise), then rounds each output once to the activations' dtype.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tessera.switches import OFF, Switch

#: GGML type numbers of the weight formats ``tsr_gemv_dense`` reads.
DENSE_TYPES = {"F16": 1, "BF16": 30}
#: Weights in one :meth:`DenseGemv.gemv_dense` call (DENSE_MAX_WEIGHTS in the C file).
MAX_DENSE_WEIGHTS = 8
#: Matmuls of fewer activation rows than this run the dense GEMV; from here on torch's
#: blocked matmul. CPU time of the GEMV / torch's bf16 matmul, 1 thread, AVX512-BF16 (AMD
#: Zen 5): 0.45 at 1-2 rows, 0.38 at 4 and 0.90 at 8 on a 151936x896 weight (memory-bound,
#: as every decode matmul is); 0.5-0.6 at 1 row, 1.2 at 4 and 1.4-2.0 at 8 on 4864x896 and
#: 896x4864 weights held in L3 (compute-bound, which decode is not).
NATIVE_DENSE_MAX_ROWS = 8
NATIVE_DENSE_DISABLE = Switch(
    "TESSERA_NATIVE_DENSE_DISABLE",
    f"dense bf16/f16 weights (F16/BF16 files, types dequantized at load) multiply on torch's "
    f"matmul at every row count instead of the native GEMV below {NATIVE_DENSE_MAX_ROWS} rows",
    OFF,
)
NATIVE_CONVERT_DISABLE = Switch(
    "TESSERA_NATIVE_CONVERT_DISABLE",
    "F16 weights are converted to bf16 at load by torch's cast instead of the native one",
    OFF,
)
F16_IN_PLACE_DISABLE = Switch(
    "TESSERA_F16_IN_PLACE_DISABLE",
    "an F16 file's weights are converted to bf16 at load even where the AMX tiles and the "
    "dense GEMV read them as they are in the file",
    OFF,
)
#: What ``tsr_dense_path()`` answers: the instructions this build multiplies with.
DENSE_PATHS = {2: "AVX512-BF16 vdpbf16ps", 1: "AVX512F", 0: "AVX2 + F16C"}


def declare_dense(lib: Any) -> None:
    """The ctypes signatures of the dense kernels of a loaded library."""
    args = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_gemv_dense.argtypes, lib.tsr_gemv_dense.restype = args, ctypes.c_int
    lib.tsr_dense_path.argtypes, lib.tsr_dense_path.restype = [], ctypes.c_int
    args = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.tsr_f16_to_bf16.argtypes, lib.tsr_f16_to_bf16.restype = args, None


class DenseGemv:
    """The dense kernels of a loaded library (``self.lib``, ``self._empty``, ``self._dtypes``,
    ``self._threads`` are set by ``NativeGemv``)."""

    lib: Any
    _empty: Any
    _dtypes: dict[Any, int]
    _threads: Any

    def dense_path(self) -> str:
        """The instructions the dense kernels of this build use (see :data:`DENSE_PATHS`)."""
        return DENSE_PATHS[self.lib.tsr_dense_path()]

    def gemv_dense(
        self, kind: str, ws: tuple[Any, ...], x: Any, biases: tuple[Any, ...] | None = None
    ) -> Any:
        """``x`` ``(T, n_in)`` (float32/bfloat16/float16, CPU) times the ``kind`` (``"F16"`` or
        ``"BF16"``) weights ``ws``: contiguous ``(n_out, n_in)`` tensors of 16-bit values
        (float16/bfloat16 tensors, or the file's bytes as uint8 ``(n_out, 2 n_in)``); at most
        :data:`MAX_DENSE_WEIGHTS`, one ``n_in``. Each output plus its bias (None, or a
        contiguous tensor of ``x``'s dtype): ``(T, sum n_out)`` in ``x``'s dtype, the outputs
        side by side, one parallel region over every row."""
        if not x.is_contiguous():
            x = x.contiguous()
        n = len(ws)
        if x.shape[0] == 0:  # no rows (an expert no token chose): nothing for the kernel
            return self._empty((0, sum(w.shape[0] for w in ws)), dtype=x.dtype)
        biases = biases or (None,) * n
        ptrs = (ctypes.c_void_p * n)(*(w.data_ptr() for w in ws))
        n_outs = (ctypes.c_int64 * n)(*(w.shape[0] for w in ws))
        bias_ptrs = (ctypes.c_void_p * n)(*(None if b is None else b.data_ptr() for b in biases))
        y = self._empty((x.shape[0], sum(w.shape[0] for w in ws)), dtype=x.dtype)
        done = self.lib.tsr_gemv_dense(
            DENSE_TYPES[kind], n, ptrs, n_outs, bias_ptrs, x.shape[1], x.data_ptr(), x.shape[0],
            y.data_ptr(), self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        if not done:
            raise MemoryError(f"the native {kind} matmul could not run on {n} weights")
        return y

    def f16_to_bf16(self, values: Any) -> Any:
        """The float16 tensor ``values`` (contiguous, CPU) as a new bfloat16 tensor of its
        shape: each value widened to float32 and rounded once to nearest even, torch's cast
        bit for bit except that a NaN keeps its sign and payload (quieted, as ggml does)."""
        import torch

        out = self._empty(values.shape, dtype=torch.bfloat16)
        self.lib.tsr_f16_to_bf16(values.data_ptr(), out.data_ptr(), values.numel(), self._threads())
        return out

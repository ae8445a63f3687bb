"""A quantized weight kept as the file's block bytes on the CPU and multiplied by the native
kernels (:mod:`tessera.backends.native`), for the block types beyond Q4_0/Q8_0 (Q4_1, Q5_0,
Q5_1, IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0 and the grid
types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M).

Not an entry point; the quant plugins wrap their torch kernels with :func:`with_native`.
Decode matmuls (fewer than :data:`NATIVE_MAX_ROWS` rows, :data:`AMX_MAX_ROWS` on a CPU with
AMX) read the bytes in place with int8
dot products; larger ones of Q4_1, Q5_0, Q5_1 and IQ4_NL run the int8 VNNI prefill GEMM
where the AMX tiles are off (:mod:`~tessera.backends.native.vnni_gemm`), the others
dequantize natively to the compute dtype (the numpy dequantization's values, rounded once)
and run torch's dense matmul; no dense copy is kept, so the weight takes its file size in
memory instead of 2 bytes per value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.backends.native.probe import serves
from tessera.backends.native.vnni_gemm import VNNI_GGML_TYPES
from tessera.contract.quant import QuantType, WeightKernel, file_bytes_tensor

#: Matmuls of fewer rows run the native GEMV; from here on the weight is dequantized and
#: multiplied densely. CPU time of the GEMV / dequantize + bf16 matmul (AVX512-BF16, no
#: AMX), 4864x896 and 896x4864 weights, 1 thread: 0.06-0.14 at 1 row, 0.26-0.32 at 8,
#: 0.45-0.61 at 16, 0.78-1.00 at 32, 1.12-1.45 at 64.
NATIVE_MAX_ROWS = 32
#: The same where the AMX tiles run the dense bf16 matmul (several times faster there).
AMX_MAX_ROWS = 16


class NativeBlockWeight:
    """A ``kind`` weight of the torch backend's quantized-weight interface (``shape``,
    ``matmul``, ``get_rows``) over its GGUF block bytes ``raw`` (uint8 ``(n_out, row bytes)``,
    usually a view of the memory-mapped file), with ``native_gemv`` for the backend's
    batched decode matmuls and the fused decoder block."""

    def __init__(self, kind: str, raw: Any, n_in: int, native: Any, dtype: Any) -> None:
        self.kind = kind
        self.raw = raw
        self.native = native
        self.dtype = dtype
        self.shape = (raw.shape[0], n_in)
        self.max_rows = AMX_MAX_ROWS if native.amx else NATIVE_MAX_ROWS

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        if x.shape[0] == 0:  # a pruned layer's rows when no logits are asked for
            return x.new_empty((0, self.shape[0]))
        if x.shape[0] < self.max_rows:
            return self.native.matmul(self.kind, self.raw, x)
        if self.native_tiles(x.shape[0]) is not None:
            y = self.native.matmul_vnni(self.kind, (self.raw,), x)
            if y is not None:
                return y
        # dequantized into a buffer the next weight's matmul reuses: F.linear is done with it
        return F.linear(x, self.native.dequantize_typed(self.kind, self.raw, x.dtype, scratch=True))

    def native_gemv(self, n_rows: int) -> tuple[str, Any] | None:
        """``(kind, block bytes)`` when a matmul of ``n_rows`` rows runs the native GEMV (not
        for no rows: a pruned layer's empty matmul is the dense path's)."""
        return (self.kind, self.raw) if 0 < n_rows < self.max_rows else None

    def native_tiles(self, n_rows: int) -> tuple[str, Any] | None:
        """``(kind, block bytes)`` when a matmul of ``n_rows`` rows runs the int8 VNNI prefill
        GEMM (Q4_1, Q5_0, Q5_1, IQ4_NL where the AMX tiles are off; the backend may then fuse
        the gate and up weights into one SwiGLU call), else None."""
        native = self.native
        if self.kind not in VNNI_GGML_TYPES or native.amx:
            return None
        return (
            (self.kind, self.raw) if native.vnni_serves(n_rows, self.shape[0], self.dtype) else None
        )

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        rows = self.raw[torch.from_numpy(np.asarray(ids, dtype=np.int64))]
        return self.native.dequantize(self.kind, rows, self.dtype)


def native_for(backend: Any, qtype: QuantType) -> Any:
    """The native kernels when they take ``qtype`` weights on ``backend``, else None."""
    if getattr(backend, "name", "") != "torch":
        return None
    return serves(backend, qtype.name)


def load_native(backend: Any, raw: Any, qtype: QuantType, native: Any) -> NativeBlockWeight:
    """A :class:`NativeBlockWeight` over the bytes of ``raw`` (a 2-D RawTensor)."""
    n_out, n_in = raw.shape
    rows = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(n_out, -1)
    return NativeBlockWeight(qtype.name, file_bytes_tensor(rows), n_in, native, backend.torch_dtype)


def with_native(qtype: QuantType, kernel: WeightKernel | None) -> WeightKernel:
    """``qtype``'s torch kernel: the native block kernels where they serve the backend (CPU
    bf16/f16, probe passed, the type not in ``TESSERA_NATIVE_QUANT_DISABLE``), else
    ``kernel``'s own path (None: the backend dequantizes the weight at load)."""

    def supports(backend: Any) -> bool:
        if native_for(backend, qtype) is not None:
            return True
        return kernel is not None and kernel.supports(backend)

    def load(backend: Any, raw: Any, **options: Any) -> Any:
        native = native_for(backend, qtype)
        if native is not None:
            return load_native(backend, raw, qtype, native)
        if kernel is None:
            raise ValueError(f"no torch kernel for {qtype.name} without the native kernels")
        return kernel.load(backend, raw, **options)

    fallback = f"; else {kernel.description}" if kernel is not None else ""
    description = f"native: block bytes in place, int8 dot products for decode{fallback}"
    return WeightKernel("torch", qtype.name, supports, load, description)

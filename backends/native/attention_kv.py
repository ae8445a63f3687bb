"""Native decode attention over a KV cache stored in its own type (``native_attention.c``:
float32, bfloat16, float16 or q8_0 blocks, read in place), as a method that
:class:`~tessera.backends.native.kernels.NativeGemv` inherits.

The kernel reads the rows in tiles with a running softmax (flash-decoding), so its work is
linear in the rows a query reads and the memory it holds stays the same at any depth;
one decode token's rows are split over the threads when its KV heads are fewer.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: The kernel's code of each cache storage type (the dtypes' codes, q8_0's GGML number).
KV_TYPE_CODES = {"f32": 0, "bf16": 1, "f16": 2, "q8_0": 8}


def declare_attention_kv(lib: Any) -> None:
    """The ctypes signature of ``tsr_attention_kv`` of a loaded library."""
    args = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p, ctypes.c_int]
    args += [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_int64] * 2 + [ctypes.c_void_p]
    args += [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_attention_kv.argtypes, lib.tsr_attention_kv.restype = args, ctypes.c_int


class KVAttention:
    """The typed-cache attention of a loaded library (``self.lib``, ``self._empty``,
    ``self._dtypes``, ``self._threads`` are set by ``NativeGemv``)."""

    lib: Any
    _empty: Any
    _dtypes: dict[Any, int]
    _threads: Any

    def attention_kv(
        self,
        q: Any,
        k: Any,
        k_type: str,
        v: Any,
        v_type: str,
        shape: tuple[int, int, int],
        lists: Any,
        scale: float,
    ) -> Any:
        """The ``attention_rows`` op for a few queries ``q`` ``(T, H, D)`` (bf16/f16/f32, CPU)
        over caches of types ``k_type`` / ``v_type`` (names of :data:`KV_TYPE_CODES`): ``k``
        and ``v`` contiguous CPU tensors holding their rows (the values, or q8_0's block
        bytes), ``shape`` ``(cells, Hkv, Dv)`` of V; ``lists`` the ubatch's
        :class:`~tessera.backends.native.kernels.RowLists`. Float32 scores, softmax and
        sums, one rounding per output; returns ``(T, H * Dv)`` in ``q``'s dtype."""
        q = q.contiguous()
        t, h, d = q.shape
        _, h_kv, dv = shape
        out = self._empty((t, h * dv), dtype=q.dtype)
        done = self.lib.tsr_attention_kv(
            q.data_ptr(), t, h, d, k.data_ptr(), KV_TYPE_CODES[k_type], v.data_ptr(),
            KV_TYPE_CODES[v_type], h_kv, dv, *lists.args, scale, out.data_ptr(),
            self._dtypes[q.dtype], self._threads(),
        )  # fmt: skip
        if not done:
            raise MemoryError("the native attention could not allocate its buffers")
        return out

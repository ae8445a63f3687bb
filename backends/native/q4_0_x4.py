"""Q4_0 weights in the 4-row layout (``native_q4_0_x4.c``): the file's bytes rearranged once
at load so that the decode GEMV reads them in address order, as methods that
:class:`~tessera.backends.native.kernels.NativeGemv` inherits.

The GEMV takes four weight rows per pass; in the file's layout those are four streams of
18-byte blocks side by side. In the 4-row layout the four rows' codes of one block are one
aligned 64 bytes and their scales 8 bytes of a separate array, so a thread reads one long
stream of codes (and one of scales an eighth its size). The copy takes the place of the
file's bytes (the same size); prefill's dequantization, the AMX tiles and ``get_rows`` get
the file's rows back from it per call (:meth:`Q4_0x4Gemv.unpack_q4_0_x4`).

``TESSERA_NATIVE_Q4_0_REPACK=0`` (:data:`NATIVE_Q4_0_REPACK`) keeps the file's layout; the
portable path (plain C loops) reads the file's layout only.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tessera.backends.native import cpu_paths
from tessera.switches import ON, Choice, Switch, choose

#: The kind name of a Q4_0 weight in the 4-row layout (``NativeGemv.matmul``'s ``kind``).
KIND = "Q4_0_x4"
#: Its code in the decoder block's struct (``TSR_TYPE_Q4_0_X4``; no GGML type has it).
BLOCK_TYPE = 1002
#: Rows per group of the layout: a weight's rows must be a multiple of it.
GROUP_ROWS = 4
NATIVE_Q4_0_REPACK = Switch(
    "TESSERA_NATIVE_Q4_0_REPACK",
    "Q4_0 weights on the native kernels are rearranged at load into 4-row blocks read in "
    "address order by the decode GEMV (0: the file's layout)",
    ON,
    default=True,
)


def declare_q4_0_x4(lib: Any) -> None:
    """The ctypes signatures of the 4-row layout's functions of a loaded library."""
    lib.tsr_repack_q4_0_x4.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.tsr_repack_q4_0_x4.argtypes += [ctypes.c_void_p, ctypes.c_int]
    lib.tsr_repack_q4_0_x4.restype = None
    lib.tsr_unpack_q4_0_x4.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.tsr_unpack_q4_0_x4.argtypes += [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.tsr_unpack_q4_0_x4.argtypes += [ctypes.c_int]
    lib.tsr_unpack_q4_0_x4.restype = None
    args = [ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_gemv_q4_0_x4.argtypes, lib.tsr_gemv_q4_0_x4.restype = args, ctypes.c_int


def layout_choice(gemv: Any) -> Choice:
    """Whether Q4_0 weights on ``gemv`` (a loaded NativeGemv) take the 4-row layout
    (path :data:`KIND`) or keep the file's (``"Q4_0"``), and why."""

    def probe() -> tuple[bool, str]:
        if gemv.portable:
            return (
                False,
                f"the portable path reads the file's layout ({cpu_paths.NATIVE_PATH.name})",
            )
        path = cpu_paths.quant_path(gemv.isa, gemv.portable)
        return True, f"4-row blocks in address order for the {path} decode GEMV"

    return choose(NATIVE_Q4_0_REPACK, probe, on=KIND, off="Q4_0")


class Q4_0x4Gemv:
    """The 4-row layout's functions of a loaded library (``self.lib``, ``self._empty``,
    ``self._threads`` are set by ``NativeGemv``)."""

    lib: Any
    _empty: Any
    _threads: Any

    def repack_q4_0_x4(self, raw: Any) -> Any:
        """The 4-row layout of ``raw`` (uint8 Q4_0 block bytes ``(n_out, row bytes)``, CPU,
        ``n_out`` a multiple of :data:`GROUP_ROWS`): a new tensor of the same shape."""
        import torch

        n_out, row_bytes = raw.shape
        if n_out % GROUP_ROWS:
            raise ValueError(
                f"a Q4_0 weight of {n_out} rows has no 4-row layout (rows must be a multiple "
                f"of {GROUP_ROWS}); keep its file layout"
            )
        raw = raw.contiguous()
        out = self._empty((n_out, row_bytes), dtype=torch.uint8)
        n_in = row_bytes // 18 * 32
        self.lib.tsr_repack_q4_0_x4(raw.data_ptr(), n_out, n_in, out.data_ptr(), self._threads())
        return out

    def unpack_q4_0_x4(self, packed: Any, ids: Any = None) -> Any:
        """Rows ``ids`` (an int64 tensor of row numbers; None: every row) of the 4-row
        layout ``packed`` as the file's block bytes ``(len(ids), row bytes)``."""
        import torch

        n_out, row_bytes = packed.shape
        n_in = row_bytes // 18 * 32
        if ids is not None:
            ids = ids.to(torch.int64).contiguous()
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_out):
                raise IndexError(f"row ids must be in 0..{n_out - 1} for this Q4_0 weight")
        n = n_out if ids is None else ids.numel()
        out = self._empty((n, row_bytes), dtype=torch.uint8)
        self.lib.tsr_unpack_q4_0_x4(
            packed.data_ptr(), n_out, n_in, None if ids is None else ids.data_ptr(), n,
            out.data_ptr(), self._threads(),
        )  # fmt: skip
        return out

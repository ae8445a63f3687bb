"""Native decode matmuls for Q8_0 / Q4_0 on the CPU: the C library's functions as methods
of :class:`NativeGemv`.

torch's CPU int4 kernel is compute-bound at one activation row, so decode read 4-bit
weights at about half the memory bandwidth. ``native_gemv.c`` does what llama.cpp does
instead: it quantizes the few activation rows to int8 blocks of 32 and multiplies them with
the GGUF block bytes in place using VNNI integer dot products (see the C file). It also
dequantizes Q4_0 for prefill matmuls, bit for bit as the torch ops do, in one pass, and
runs decode's RMSNorm (float32 statistics) and RoPE (bit for bit the torch ops' values) in
one call each instead of several torch ops. On CPUs with AMX, ``native_amx.c`` runs larger
bf16 matmuls (prefill, batches) of Q4_0 / Q8_0 weights on the tile units, dequantizing each
block straight into a tile (:meth:`NativeGemv.matmul_tiles`; ``TESSERA_NATIVE_AMX_DISABLE=1``
turns just that off); without AMX the same methods run ``native_vnni_gemm.c``'s int8 VNNI
GEMM (:mod:`~tessera.backends.native.vnni_gemm`). The other block types (Q4_1, Q5_0, Q5_1,
IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ1_0, TQ2_0) have their decode
matmuls and dequantization in ``native_qgemv.c``
(:class:`~tessera.backends.native.typed_gemv.TypedGemv`), through the same methods.

:mod:`tessera.backends.native.library` builds and loads the library,
:mod:`tessera.backends.native.selftest` checks it against numpy, and
:mod:`tessera.backends.native.probe` decides whether a backend gets it.
"""

from __future__ import annotations

import ctypes
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tessera.backends.native.attention_kv import KVAttention
from tessera.backends.native.dense_gemv import DENSE_TYPES, DenseGemv
from tessera.backends.native.portable_gemv import PORTABLE_TYPES, PortableGemv
from tessera.backends.native.q4_0_x4 import BLOCK_TYPE, KIND, Q4_0x4Gemv
from tessera.backends.native.typed_gemv import GGML_TYPES, TypedGemv
from tessera.backends.native.vnni_gemm import VnniGemm
from tessera.switches import Choice

#: Matmuls of at least this many bf16 rows run on the AMX tiles where there are any; the
#: VNNI kernel's / the AMX kernel's time (4864x896 and 896x4864, Q4_0 and Q8_0, 1 and 2
#: threads): 0.55-0.86 at 8 rows, 1.06-1.54 at 16, 1.84-2.78 at 32, 2.8-4.2 at 64.
AMX_MIN_ROWS = 16
#: Block bytes per 32 weights of the types native_gemv.c reads.
TYPE_SIZES = {"Q4_0": 18, "Q8_0": 34}
#: GGML type numbers of the weight kinds the AMX tiles read (BF16 and F16: 2-D tensors of
#: the values, F16 rounded to bf16 as each block enters a tile).
TILE_TYPES = {"Q4_0": 2, "Q8_0": 8, "BF16": 30, "F16": 1}
#: GGML type numbers of every type the decoder block (``tsr_block_decode``) takes, and the
#: 4-row Q4_0 layout's code.
BLOCK_GGML_TYPES = {"Q4_0": 2, "Q8_0": 8, KIND: BLOCK_TYPE, **GGML_TYPES, **DENSE_TYPES}
#: Weights in one :meth:`NativeGemv.matmul_n` call (GEMV_MAX_WEIGHTS in the C file).
MAX_WEIGHTS = 8


class NativeGemv(TypedGemv, DenseGemv, KVAttention, PortableGemv, Q4_0x4Gemv, VnniGemm):
    """The loaded library: ``matmul(kind, w, x)`` multiplies ``x`` by a block-byte weight."""

    def __init__(self, lib: Any, path: Path) -> None:
        import torch

        self.lib = lib
        self.path = path
        self._kernels = {"Q8_0": lib.tsr_gemv_q8_0, "Q4_0": lib.tsr_gemv_q4_0}
        self._gemv_n = {
            "Q4_0": partial(lib.tsr_gemv_n, TYPE_SIZES["Q4_0"]),
            "Q8_0": partial(lib.tsr_gemv_n, TYPE_SIZES["Q8_0"]),
            KIND: lib.tsr_gemv_q4_0_x4,
        }
        self._dtypes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
        self._empty = torch.empty
        self._threads = torch.get_num_threads  # what backend.set_threads (-t) set
        self._weight_sets: dict[tuple[int, ...], tuple[Any, ...]] = {}
        #: whether :meth:`matmul_tiles` runs (an AMX build whose tiles the OS granted), and
        #: why (set by :func:`tessera.backends.native.library.load`)
        self.amx = False
        self.amx_choice = Choice("off", "not probed")
        self._amx_scratch: Any = None
        self.portable = False  # quantized decode on the plain C loops (cpu_paths.py)
        self.isa, self.path_reason = 0, ""  # the build's tsr_native_isa() bits; why that path

    def __repr__(self) -> str:
        return f"NativeGemv({str(self.path)!r})"

    def matmul(self, kind: str, w: Any, x: Any) -> Any:
        """``x @ W.T`` for ``kind`` ``"Q8_0"``, ``"Q4_0"``, ``"Q4_0_x4"`` (the 4-row layout of
        :mod:`~tessera.backends.native.q4_0_x4`) or one of
        :data:`~tessera.backends.native.typed_gemv.GGML_TYPES`, ``w`` a contiguous uint8 CPU
        tensor of block bytes ``(n_out, row bytes)``, ``x`` a ``(T, n_in)`` CPU tensor in
        float32, bfloat16 or float16; the result has ``x``'s dtype."""
        if kind == KIND:
            return self._block_gemv(kind, (w,), x, (None,))
        if kind in DENSE_TYPES:
            return self.gemv_dense(kind, (w,), x)
        if self.portable and kind in PORTABLE_TYPES:
            return self.gemv_portable(kind, (w,), x)
        if kind not in self._kernels:
            return self.gemv_typed(kind, (w,), x)
        if not x.is_contiguous():
            x = x.contiguous()
        n_rows, n_in = x.shape
        y = self._empty((n_rows, w.shape[0]), dtype=x.dtype)
        # the kernel reads and writes x's dtype itself: no conversions (~170 calls a token)
        self._kernels[kind](
            w.data_ptr(),
            w.shape[0],
            n_in,
            x.data_ptr(),
            n_rows,
            y.data_ptr(),
            self._dtypes[x.dtype],
            self._threads(),
        )
        return y

    def matmul_n(self, kind: str, ws: tuple[Any, ...], x: Any, biases: tuple[Any, ...]) -> Any:
        """``x`` times several ``kind`` weights at once (block bytes as in :meth:`matmul`, the
        same ``n_in``; at most :data:`MAX_WEIGHTS`), each plus its bias (a contiguous
        tensor of ``x``'s dtype, or None): ``(T, sum n_out)``, the outputs side by side.
        The activations are quantized once and one parallel region covers every row."""
        if kind in DENSE_TYPES:
            return self.gemv_dense(kind, ws, x, biases)
        if self.portable and kind in PORTABLE_TYPES:
            return self.gemv_portable(kind, ws, x, biases)
        if kind not in self._gemv_n:
            return self.gemv_typed(kind, ws, x, biases)
        return self._block_gemv(kind, ws, x, biases)

    def _block_gemv(self, kind: str, ws: tuple[Any, ...], x: Any, biases: tuple[Any, ...]) -> Any:
        """:meth:`matmul_n` on ``native_gemv.c``'s kernels (Q4_0, Q8_0, Q4_0 4-row)."""
        if not x.is_contiguous():
            x = x.contiguous()
        key = tuple(map(id, ws + biases))
        args = self._weight_sets.get(key)
        if args is None:  # ctypes arrays made once per set (layers call with the same one)
            ptrs = (ctypes.c_void_p * len(ws))(*(w.data_ptr() for w in ws))
            n_outs = (ctypes.c_int64 * len(ws))(*(w.shape[0] for w in ws))
            bias_ptrs = (ctypes.c_void_p * len(ws))(
                *(None if b is None else b.data_ptr() for b in biases)
            )
            width = sum(w.shape[0] for w in ws)
            # the tensors are kept with their addresses, so the ids stay theirs
            args = self._weight_sets[key] = (ws, biases, ptrs, n_outs, bias_ptrs, width)
        _, _, ptrs, n_outs, bias_ptrs, width = args
        y = self._empty((x.shape[0], width), dtype=x.dtype)
        done = self._gemv_n[kind](
            len(ws), ptrs, n_outs, bias_ptrs, x.shape[1], x.data_ptr(), x.shape[0],
            y.data_ptr(), self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        if not done:
            raise ValueError(f"the native {kind} matmul does not take these {len(ws)} weights")
        return y

    def tiles_serve(self, n_rows: int, n_out: int, dtype: Any, multiple: int = 32) -> bool:
        """Whether :meth:`matmul_tiles` takes a matmul of this shape and dtype
        (:meth:`swiglu_tiles`: ``multiple=16``)."""
        import torch

        ok = self.amx and n_rows >= AMX_MIN_ROWS and dtype == torch.bfloat16
        return ok and n_out % multiple == 0

    def prefill_serves(self, n_rows: int, n_out: int, dtype: Any, multiple: int = 32) -> bool:
        """Whether :meth:`matmul_tiles` takes this matmul: on the AMX tiles
        (:meth:`tiles_serve`) or, where they are off, on the int8 VNNI GEMM
        (:meth:`~tessera.backends.native.vnni_gemm.VnniGemm.vnni_serves`)."""
        if self.amx:
            return self.tiles_serve(n_rows, n_out, dtype, multiple)
        return self.vnni_serves(n_rows, n_out, dtype, multiple)

    def matmul_tiles(self, kind: str, w: Any, x: Any) -> Any:
        """``x @ W.T`` on the AMX tile units for ``kind`` ``"Q8_0"`` or ``"Q4_0"`` (block
        bytes as in :meth:`matmul`), ``x`` a ``(T, n_in)`` bfloat16 CPU tensor; each weight
        block is dequantized to bf16 (the values prefill's dequantization gives) and the
        products summed in float32. None where :meth:`tiles_serve` says no (no AMX, fewer
        than ``AMX_MIN_ROWS`` rows, another dtype, ``n_out`` not a multiple of 32). Where the
        tiles are off, the int8 VNNI GEMM (:meth:`prefill_serves` says when)."""
        if not self.amx:
            return self.matmul_vnni(kind, (w,), x)
        return self._tiles(self.lib.tsr_matmul_amx, kind, (w,), x)

    def swiglu_tiles(self, kind: str, w_gate: Any, w_up: Any, x: Any) -> Any:
        """``silu(x @ W_gate.T) * (x @ W_up.T)`` on the AMX tile units (as
        :meth:`matmul_tiles`, the two weights of one shape and kind, ``n_out`` a multiple of
        16), the product formed in float32 and rounded once; None where
        :meth:`tiles_serve` says no."""
        if w_gate.shape != w_up.shape:
            return None
        if not self.amx:  # the int8 VNNI GEMM, x quantized once for both weights
            return self.matmul_vnni(kind, (w_gate, w_up), x)
        return self._tiles(self.lib.tsr_swiglu_amx, kind, (w_gate, w_up), x, 16)

    def _tiles(
        self,
        fn: Any,
        kind: str,
        ws: tuple[Any, ...],
        x: Any,
        multiple: int = 32,
        out_dtype: Any = None,
    ) -> Any:
        """``fn`` (one of native_amx.c's entry points) on ``ws``: the output in ``out_dtype``
        (default ``x``'s), None where :meth:`tiles_serve` says no or the kernel declines."""
        import torch

        n_out = ws[0].shape[0]
        if not self.tiles_serve(x.shape[0], n_out, x.dtype, multiple):
            return None
        if not x.is_contiguous():
            x = x.contiguous()
        n_rows, n_in = x.shape
        threads = self._threads()
        need = threads * self.lib.tsr_amx_scratch_bytes(n_in) + 64
        if self._amx_scratch is None or self._amx_scratch.numel() < need:
            # kept between calls: layers ask for the same few sizes (at most ~1 MiB)
            self._amx_scratch = torch.empty(need, dtype=torch.uint8)
        aligned = -self._amx_scratch.data_ptr() % 64
        y = self._empty((n_rows, n_out), dtype=out_dtype or x.dtype)
        done = fn(
            TILE_TYPES[kind], *(w.data_ptr() for w in ws), n_out, n_in, x.data_ptr(), n_rows,
            y.data_ptr(), self._amx_scratch.data_ptr() + aligned, threads,
        )  # fmt: skip
        return y if done else None

    def dequantize(self, kind: str, w: Any, dtype: Any) -> Any:
        """The ``"Q4_0"`` weight ``w`` (uint8 block bytes ``(n_out, row bytes)``, contiguous,
        CPU) as a dense ``(n_out, n_in)`` tensor of ``dtype``, bit for bit what the torch
        dequantization gives (prefill matmuls); other kinds: :meth:`dequantize_typed`."""
        if kind != "Q4_0":
            return self.dequantize_typed(kind, w, dtype)
        if not w.is_contiguous():
            w = w.contiguous()
        n_in = w.shape[1] // 18 * 32
        y = self._empty((w.shape[0], n_in), dtype=dtype)
        self.lib.tsr_dequant_q4_0(
            w.data_ptr(), w.shape[0], n_in, y.data_ptr(), self._dtypes[dtype], self._threads()
        )
        return y

    def rms_norm(self, x: Any, weight_f32: Any, eps: float) -> Any:
        """RMSNorm of each row of ``x`` (last axis; bf16/f16/f32, CPU) with float32
        statistics, times ``weight_f32`` (a contiguous float32 tensor, or None)."""
        if not x.is_contiguous():
            x = x.contiguous()
        n = x.shape[-1]
        y = self._empty(x.shape, dtype=x.dtype)
        w = 0 if weight_f32 is None else weight_f32.data_ptr()
        self.lib.tsr_rms_norm(
            x.data_ptr(),
            x.numel() // n,
            n,
            w,
            eps,
            y.data_ptr(),
            self._dtypes[x.dtype],
            self._threads(),
        )
        return y

    def attention_rows(
        self, q: Any, k_cache: Any, v_cache: Any, lists: RowLists, scale: float
    ) -> Any:
        """The ``attention_rows`` op for a few queries: ``q`` ``(T, H, D)``, the whole caches
        ``(cells, Hkv, D|Dv)`` (contiguous, ``q``'s dtype), the ubatch's row lists. Float32
        scores and softmax, one rounding per output; returns ``(T, H * Dv)``."""
        q = q.contiguous()
        t, h, d = q.shape
        h_kv, dv = v_cache.shape[1], v_cache.shape[2]
        out = self._empty((t, h * dv), dtype=q.dtype)
        self.lib.tsr_attention_rows(
            q.data_ptr(), t, h, d, k_cache.data_ptr(), v_cache.data_ptr(), h_kv, dv,
            *lists.args, scale, out.data_ptr(), self._dtypes[q.dtype], self._threads(),
        )  # fmt: skip
        return out

    def block_decode(self, block: BlockStruct, step: StepStruct, x: Any) -> Any:
        """A whole decoder block for one token (``x`` ``(1, n_embd)``, contiguous, the
        compute dtype) in one call, written over ``x`` (returned); writes the token's K/V
        into the caches."""
        y = x  # the C function reads x only before it writes y
        ok = self.lib.tsr_block_decode(
            ctypes.byref(block), ctypes.byref(step), x.data_ptr(), y.data_ptr(),
            self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        if not ok:
            raise MemoryError("the native decoder block could not allocate its buffers")
        return y

    def rope(self, x: Any, cos: Any, sin: Any, n_rot: int, neox: bool) -> Any:
        """``x`` ``(T, H, D)`` (bf16/f16, CPU) rotated by the angle tables ``cos``/``sin``
        (``T`` rows of ``n_rot / 2`` values in ``x``'s dtype), bit for bit what the torch
        backend's eager rope ops give (each product and sum rounded to the dtype)."""
        x = x.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        y = self._empty(x.shape, dtype=x.dtype)
        t, h, d = x.shape
        self.lib.tsr_rope(
            x.data_ptr(), t, h, d, n_rot, cos.data_ptr(), sin.data_ptr(), int(neox),
            y.data_ptr(), self._dtypes[x.dtype],
        )  # fmt: skip
        return y


class BlockStruct(ctypes.Structure):
    """``tsr_block`` of the C file: one decoder block's shape and weight addresses."""

    _fields_ = [
        *((f, ctypes.c_int64) for f in ("n_embd", "n_head", "n_head_kv", "head_dim", "n_ff")),
        ("n_rot", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("neox", ctypes.c_int),
        *((f"type_{w}", ctypes.c_int) for w in ("q", "k", "v", "o", "gate", "up", "down")),
        *((f, ctypes.c_void_p) for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")),
        *((f, ctypes.c_void_p) for f in ("bq", "bk", "bv", "attn_norm", "ffn_norm")),
        *((f, ctypes.c_void_p) for f in ("q_norm", "k_norm", "k_cache", "v_cache")),
        ("k_type", ctypes.c_int),  # the caches' storage types (attention_kv.KV_TYPE_CODES)
        ("v_type", ctypes.c_int),
    ]


class StepStruct(ctypes.Structure):
    """``tsr_step`` of the C file: the token's angles, its cache cell and the rows it reads."""

    _fields_ = [
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("cell", ctypes.c_int64),
        ("rows", ctypes.c_void_p),
        ("n_rows", ctypes.c_int64),
    ]


class RowLists:
    """The row lists of a :class:`~tessera.engine.kv_view.KVRows` as the attention kernel reads
    them, made once per ubatch: ``rows`` and ``q_rows`` int64, ``allowed`` (S, Tq, R) bool or
    None when every row is allowed; the arrays are kept alive with their addresses."""

    def __init__(self, rows: np.ndarray, q_rows: np.ndarray, allowed: np.ndarray | None) -> None:
        self.rows = np.ascontiguousarray(rows, dtype=np.int64)
        self.q_rows = np.ascontiguousarray(q_rows, dtype=np.int64)
        self.allowed = None if allowed is None else np.ascontiguousarray(allowed, dtype=np.bool_)
        (s, r), tq = self.rows.shape, self.q_rows.shape[1]
        mask = None if self.allowed is None else self.allowed.ctypes.data
        self.args = (self.rows.ctypes.data, s, r, self.q_rows.ctypes.data, tq, mask)

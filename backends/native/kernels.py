"""Native decode matmuls for Q8_0 / Q4_0 on the CPU: a small C library built on first use.

torch's CPU int4 kernel is compute-bound at one activation row, so decode read 4-bit
weights at about half the memory bandwidth. ``native_gemv.c`` does what llama.cpp does
instead: it quantizes the few activation rows to int8 blocks of 32 and multiplies them with
the GGUF block bytes in place using VNNI integer dot products (see the C file). It also
dequantizes Q4_0 for prefill matmuls, bit for bit as the torch ops do, in one pass, and
runs decode's RMSNorm (float32 statistics) and RoPE (bit for bit the torch ops' values) in
one call each instead of several torch ops. On CPUs with AMX, ``native_amx.c`` runs larger
bf16 matmuls (prefill, batches) of Q4_0 / Q8_0 weights on the tile units, dequantizing each
block straight into a tile (:meth:`NativeGemv.matmul_tiles`; ``TESSERA_NATIVE_AMX_DISABLE=1``
turns just that off).

The library is compiled with the system C compiler (``$CC``, default ``cc``) into
``$XDG_CACHE_HOME/tessera/native/<hash>.so`` (default ``~/.cache``), keyed by the source,
the compiler's version, the flags and the CPU's flags; it is written under a temporary
name and renamed, so concurrent processes and crashes never leave a half-written library.

Capability probe (:func:`probe`, cached per backend in ``backend.probe_cache``): the CPU
has AVX2/FMA/F16C and AVX512-VNNI (with VL) or AVX-VNNI, a compiler runs, the library
builds, runs once in a child process (so an illegal instruction cannot kill the caller),
loads, and a self-test on random weights agrees with numpy within the error bound of
int8 activations. Otherwise the weight kernels keep their torch paths.
``TESSERA_NATIVE_DISABLE=1`` switches it off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np

SOURCE = Path(__file__).with_name("native_gemv.c")
#: Compiled together with SOURCE into the one library: the AMX prefill matmuls.
AMX_SOURCE = Path(__file__).with_name("native_amx.c")
#: ``1`` keeps matmuls off the AMX kernel (the rest of the native kernels stay on).
AMX_DISABLE_ENV = "TESSERA_NATIVE_AMX_DISABLE"
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
#: All of these, and one of VNNI_FLAG_SETS, must be in /proc/cpuinfo's flags.
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
VNNI_FLAG_SETS = (("avx512_vnni", "avx512vl"), ("avx_vnni",))
#: Compute dtypes the kernels serve: rounding activations to int8 blocks costs about what
#: bf16 rounding does (|error| <= max|block| / 254 per value), so f32 keeps exact matmuls.
COMPUTE_DTYPES = ("bf16", "f16")
ABI = 5
#: Matmuls of at least this many bf16 rows run on the AMX tiles where there are any; the
#: VNNI kernel's / the AMX kernel's time (4864x896 and 896x4864, Q4_0 and Q8_0, 1 and 2
#: threads): 0.55-0.86 at 8 rows, 1.06-1.54 at 16, 1.84-2.78 at 32, 2.8-4.2 at 64.
AMX_MIN_ROWS = 16
#: Block bytes per 32 weights of the types the kernels read.
TYPE_SIZES = {"Q4_0": 18, "Q8_0": 34}
#: Weights in one :meth:`NativeGemv.matmul_n` call (GEMV_MAX_WEIGHTS in the C file).
MAX_WEIGHTS = 8


class NativeGemv:
    """The loaded library: ``matmul(kind, w, x)`` multiplies ``x`` by a block-byte weight."""

    def __init__(self, lib: Any, path: Path) -> None:
        import torch

        self.lib = lib
        self.path = path
        self._kernels = {"Q8_0": lib.tsr_gemv_q8_0, "Q4_0": lib.tsr_gemv_q4_0}
        self._dtypes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
        self._empty = torch.empty
        self._threads = torch.get_num_threads  # what backend.set_threads (-t) set
        self._weight_sets: dict[tuple[int, ...], tuple[Any, ...]] = {}
        #: whether :meth:`matmul_tiles` runs (an AMX build whose tiles the OS granted)
        self.amx = False
        self._amx_scratch: Any = None

    def __repr__(self) -> str:
        return f"NativeGemv({str(self.path)!r})"

    def matmul(self, kind: str, w: Any, x: Any) -> Any:
        """``x @ W.T`` for ``kind`` ``"Q8_0"`` or ``"Q4_0"``, ``w`` a contiguous uint8 CPU tensor
        of block bytes ``(n_out, row bytes)``, ``x`` a ``(T, n_in)`` CPU tensor in float32,
        bfloat16 or float16; the result has ``x``'s dtype."""
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
        self.lib.tsr_gemv_n(
            TYPE_SIZES[kind], len(ws), ptrs, n_outs, bias_ptrs, x.shape[1], x.data_ptr(),
            x.shape[0], y.data_ptr(), self._dtypes[x.dtype], self._threads(),
        )  # fmt: skip
        return y

    def tiles_serve(self, n_rows: int, n_out: int, dtype: Any, multiple: int = 32) -> bool:
        """Whether :meth:`matmul_tiles` takes a matmul of this shape and dtype
        (:meth:`swiglu_tiles`: ``multiple=16``)."""
        import torch

        ok = self.amx and n_rows >= AMX_MIN_ROWS and dtype == torch.bfloat16
        return ok and n_out % multiple == 0

    def matmul_tiles(self, kind: str, w: Any, x: Any) -> Any:
        """``x @ W.T`` on the AMX tile units for ``kind`` ``"Q8_0"`` or ``"Q4_0"`` (block
        bytes as in :meth:`matmul`), ``x`` a ``(T, n_in)`` bfloat16 CPU tensor; each weight
        block is dequantized to bf16 (the values prefill's dequantization gives) and the
        products summed in float32. None where :meth:`tiles_serve` says no (no AMX, fewer
        than ``AMX_MIN_ROWS`` rows, another dtype, ``n_out`` not a multiple of 32)."""
        return self._tiles(self.lib.tsr_matmul_amx, kind, (w,), x)

    def swiglu_tiles(self, kind: str, w_gate: Any, w_up: Any, x: Any) -> Any:
        """``silu(x @ W_gate.T) * (x @ W_up.T)`` on the AMX tile units (as
        :meth:`matmul_tiles`, the two weights of one shape and kind, ``n_out`` a multiple of
        16), the product formed in float32 and rounded once; None where
        :meth:`tiles_serve` says no."""
        if w_gate.shape != w_up.shape:
            return None
        return self._tiles(self.lib.tsr_swiglu_amx, kind, (w_gate, w_up), x, 16)

    def _tiles(self, fn: Any, kind: str, ws: tuple[Any, ...], x: Any, multiple: int = 32) -> Any:
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
        y = self._empty((n_rows, n_out), dtype=x.dtype)
        done = fn(
            TYPE_SIZES[kind], *(w.data_ptr() for w in ws), n_out, n_in, x.data_ptr(), n_rows,
            y.data_ptr(), self._amx_scratch.data_ptr() + aligned, threads,
        )  # fmt: skip
        return y if done else None

    def dequantize(self, kind: str, w: Any, dtype: Any) -> Any:
        """The ``"Q4_0"`` weight ``w`` (uint8 block bytes ``(n_out, row bytes)``, contiguous,
        CPU) as a dense ``(n_out, n_in)`` tensor of ``dtype``, bit for bit what the torch
        dequantization gives (prefill matmuls)."""
        if kind != "Q4_0":
            raise ValueError(f"no native dequantization for {kind}")
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
        *((f, ctypes.c_int) for f in ("neox", "type_qkv", "type_o", "type_ffn_up", "type_down")),
        *((f, ctypes.c_void_p) for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")),
        *((f, ctypes.c_void_p) for f in ("bq", "bk", "bv", "attn_norm", "ffn_norm")),
        *((f, ctypes.c_void_p) for f in ("q_norm", "k_norm", "k_cache", "v_cache")),
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
    """The row lists of a :class:`~tessera.engine.kv_cache.KVRows` as the attention kernel reads
    them, made once per ubatch: ``rows`` and ``q_rows`` int64, ``allowed`` (S, Tq, R) bool or
    None when every row is allowed; the arrays are kept alive with their addresses."""

    def __init__(self, rows: np.ndarray, q_rows: np.ndarray, allowed: np.ndarray | None) -> None:
        self.rows = np.ascontiguousarray(rows, dtype=np.int64)
        self.q_rows = np.ascontiguousarray(q_rows, dtype=np.int64)
        self.allowed = None if allowed is None else np.ascontiguousarray(allowed, dtype=np.bool_)
        (s, r), tq = self.rows.shape, self.q_rows.shape[1]
        mask = None if self.allowed is None else self.allowed.ctypes.data
        self.args = (self.rows.ctypes.data, s, r, self.q_rows.ctypes.data, tq, mask)


def disabled() -> bool:
    """Whether ``TESSERA_NATIVE_DISABLE`` switches the native kernels off."""
    return os.environ.get("TESSERA_NATIVE_DISABLE", "").strip() not in ("", "0")


def amx_disabled() -> bool:
    return os.environ.get(AMX_DISABLE_ENV, "").strip() not in ("", "0")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_supported(flags: set[str]) -> bool:
    return all(f in flags for f in REQUIRED_CPU_FLAGS) and any(
        all(f in flags for f in vnni) for vnni in VNNI_FLAG_SETS
    )


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "tessera" / "native"


def build(cc: str | None = None, flags: tuple[str, ...] = CFLAGS) -> Path:
    """Compile the library (or find it in the cache); raises OSError/RuntimeError on failure.

    ``flags`` other than :data:`CFLAGS` serve tests (e.g. ``-mno-avx512f`` for the 256-bit
    path of CPUs with AVX-VNNI only)."""
    cc = cc or os.environ.get("CC", "").strip() or "cc"
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    key = hashlib.sha256()
    sources = (SOURCE, AMX_SOURCE)
    for part in (*(p.read_bytes() for p in sources), version.encode(), " ".join(flags).encode()):
        key.update(part)
    key.update(" ".join(sorted(cpu_flags())).encode())
    target = cache_dir() / f"gemv-{key.hexdigest()[:24]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".build-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *flags, "-o", tmp, *map(str, sources)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: readers see no library or a whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


#: Run in a child process before the first load: a library using instructions this CPU or
#: OS does not allow dies there (SIGILL), not in the caller.
_SMOKE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
w, x, y = (ctypes.c_char * 4096)(), (ctypes.c_float * 256)(), (ctypes.c_float * 64)()
for fn in (lib.tsr_gemv_q8_0, lib.tsr_gemv_q4_0):
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn(w, 9, 128, x, 2, y, 0, 1)
lib.tsr_dequant_q4_0.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
lib.tsr_dequant_q4_0(w, 2, 32, y, 0, 1)
lib.tsr_rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
lib.tsr_rms_norm(x, 2, 32, x, 1e-6, y, 0, 2)
lib.tsr_rope.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                         ctypes.c_void_p, ctypes.c_int]
lib.tsr_rope(x, 2, 2, 8, 8, x, x, 1, y, 1)
rows = (ctypes.c_int64 * 4)(0, 1, 2, -1)
lib.tsr_attention_rows.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
lib.tsr_attention_rows.argtypes += [ctypes.c_int64] * 2 + [ctypes.c_void_p] + [ctypes.c_int64] * 2
lib.tsr_attention_rows.argtypes += [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
lib.tsr_attention_rows.argtypes += [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
lib.tsr_attention_rows(x, 1, 2, 8, x, x, 1, 8, rows, 1, 4, rows, 1, None, 0.5, y, 0, 2)
"""


def check_runs(path: Path) -> None:
    """Call both kernels once in a child process (once per library: an ``.ok`` file marks
    success); raises RuntimeError if the child fails or dies."""
    marker = path.with_suffix(".ok")
    if marker.exists():
        return
    done = subprocess.run(
        [sys.executable, "-c", _SMOKE, str(path)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{path.name} failed in a test process (exit {done.returncode}): "
            f"{done.stderr.strip()[-300:]}"
        )
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ok-")
    os.close(fd)
    os.replace(tmp, marker)


def load(path: Path) -> NativeGemv:
    check_runs(path)
    lib = ctypes.CDLL(str(path))
    if lib.tsr_native_abi() != ABI or not lib.tsr_native_vnni():
        raise RuntimeError(f"{path} is not a VNNI build of ABI {ABI}")
    args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    for fn in (lib.tsr_gemv_q8_0, lib.tsr_gemv_q4_0):
        fn.argtypes, fn.restype = args, None
    lib.tsr_dequant_q4_0.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.tsr_dequant_q4_0.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_dequant_q4_0.restype = None
    lib.tsr_rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.tsr_rms_norm.argtypes += [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    lib.tsr_rms_norm.argtypes += [ctypes.c_int]
    lib.tsr_rms_norm.restype = None
    lib.tsr_rope.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 2
    lib.tsr_rope.argtypes += [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.tsr_rope.restype = None
    args = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    args += [ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int64]
    args += [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_attention_rows.argtypes, lib.tsr_attention_rows.restype = args, None
    lib.tsr_gemv_n.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3
    lib.tsr_gemv_n.argtypes += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    lib.tsr_gemv_n.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_gemv_n.restype = ctypes.c_int
    lib.tsr_block_decode.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int]
    lib.tsr_block_decode.restype = ctypes.c_int
    lib.tsr_amx_scratch_bytes.argtypes = [ctypes.c_int64]
    lib.tsr_amx_scratch_bytes.restype = ctypes.c_int64
    # (type size, weight(s), n_out, n_in, x, rows, y, scratch, threads)
    after_weights = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    after_weights += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.tsr_matmul_amx.argtypes = [ctypes.c_int, ctypes.c_void_p] + after_weights
    lib.tsr_swiglu_amx.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + after_weights
    lib.tsr_matmul_amx.restype = lib.tsr_swiglu_amx.restype = ctypes.c_int
    native = NativeGemv(lib, path)
    # the OS grants the tile state on request (tsr_amx_init, once per process)
    native.amx = not amx_disabled() and bool(lib.tsr_native_amx()) and bool(lib.tsr_amx_init())
    return native


def error_bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bound on ``|native - x @ w.T|`` from int8 activations: each activation is off by at
    most half a step, ``max|block| / 254``, so a dot product by at most the sum over
    blocks of that times ``sum |w|`` of the block; plus float32 rounding of the sums."""
    xb = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32)
    step = xb.max(axis=2) / 254  # (T, nb)
    wb = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1, 32).sum(axis=2)  # (n_out, nb)
    exact = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return step @ wb.T * (1 + 1e-4) + 1e-5 * exact + 1e-30


@attrs.frozen
class _GgufOracle:
    """Quantize and dequantize one GGML type with ``gguf.quants``, the self-test's oracle
    (the kernels are checked against the format, not against a quant-type plugin)."""

    name: str

    def quantize(self, x: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        return quants.quantize(x, GGMLQuantizationType[self.name])

    def dequantize(self, b: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        return quants.dequantize(b, GGMLQuantizationType[self.name])


def self_test(native: NativeGemv, threads: int = 1) -> bool:
    """Both kernels on random weights (odd row counts, 1-5 activation rows; float32 and
    bfloat16 activations) vs numpy."""
    import torch

    rng = np.random.default_rng(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for qmod, name in ((_GgufOracle("Q8_0"), "Q8_0"), (_GgufOracle("Q4_0"), "Q4_0")):
            for n_out, n_in, rows in ((37, 96, 5), (8, 64, 1), (5, 32, 2)):
                w = rng.standard_normal((n_out, n_in)).astype(np.float32)
                raw = torch.from_numpy(qmod.quantize(w))
                dense = qmod.dequantize(raw.numpy())
                for dtype, rounding in ((torch.float32, 0.0), (torch.bfloat16, 2.0**-8)):
                    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32))
                    x = x.to(dtype)
                    got = native.matmul(name, raw, x).float().numpy()
                    xs = x.float().numpy()
                    want = xs.astype(np.float64) @ dense.astype(np.float64).T
                    bound = error_bound(dense, xs) + rounding * np.abs(want)
                    if got.shape != want.shape or not np.all(np.abs(got - want) <= bound):
                        return False
                if not _matmul_n_ok(native, name, qmod, rng):
                    return False
                if name == "Q8_0":  # RMSNorm: float32 statistics, as the torch path
                    ok = _rms_norm_ok(native, rng) and _rope_ok(native, rng)
                    if not (ok and _attention_ok(native, rng)):
                        return False
                if name == "Q4_0":  # the prefill dequantization: bit for bit
                    for dtype in (torch.float32, torch.bfloat16, torch.float16):
                        want_d = torch.from_numpy(dense).to(dtype)
                        if not torch.equal(native.dequantize(name, raw, dtype), want_d):
                            return False
    finally:
        torch.set_num_threads(saved)
    return True


def tiles_ok(native: NativeGemv) -> bool:
    """The AMX matmul on random Q8_0 / Q4_0 weights (a ragged last row block) vs numpy:
    within bf16's rounding of each output and float32 sums of the dequantized weights."""
    import torch

    rng = np.random.default_rng(1)
    for qmod, name in ((_GgufOracle("Q8_0"), "Q8_0"), (_GgufOracle("Q4_0"), "Q4_0")):
        w = rng.standard_normal((64, 96)).astype(np.float32)
        raw = torch.from_numpy(qmod.quantize(w))
        dense = torch.from_numpy(qmod.dequantize(raw.numpy())).bfloat16().double().numpy()
        x = torch.from_numpy(rng.standard_normal((35, 96)).astype(np.float32)).bfloat16()
        got = native.matmul_tiles(name, raw, x)
        if got is None:
            return False
        want = x.double().numpy() @ dense.T
        exact = np.abs(x.double().numpy()) @ np.abs(dense).T
        if not np.all(np.abs(got.double().numpy() - want) <= 2.0**-8 * np.abs(want) + 1e-5 * exact):
            return False
    return True


def _matmul_n_ok(native: NativeGemv, name: str, qmod: Any, rng: np.random.Generator) -> bool:
    """Three weights (one with a bias) in one call vs numpy, in bfloat16."""
    import torch

    sizes = (9, 4, 6)
    ws = [rng.standard_normal((n, 64)).astype(np.float32) for n in sizes]
    raws = tuple(torch.from_numpy(qmod.quantize(w)) for w in ws)
    bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).bfloat16()
    x = torch.from_numpy(rng.standard_normal((2, 64)).astype(np.float32)).bfloat16()
    got = native.matmul_n(name, raws, x, (None, bias, None)).float().numpy()
    dense = np.concatenate([qmod.dequantize(r.numpy()) for r in raws]).astype(np.float64)
    xs = x.float().numpy()
    want = xs.astype(np.float64) @ dense.T
    want[:, 9:13] += bias.float().numpy()
    bound = error_bound(dense, xs) + 2.0**-8 * np.abs(want)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= bound))


def _rms_norm_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native RMSNorm vs torch's (float32 statistics) within one rounding step of the
    output dtype: only the order of the float32 sum of squares differs."""
    import torch
    import torch.nn.functional as F

    steps = ((torch.float32, 1e-6), (torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11))
    for dtype, step in steps:
        x = torch.from_numpy(rng.standard_normal((3, 100)).astype(np.float32)).to(dtype)
        w = torch.from_numpy(rng.random(100).astype(np.float32) + 0.5)
        want = F.rms_norm(x.float(), (100,), w, 1e-6)
        got = native.rms_norm(x, w, 1e-6).float()
        if not torch.all((got - want).abs() <= step * want.abs() + 1e-7):
            return False
    return True


def _rope_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native RoPE vs the torch backend's eager ops, bit for bit (both pair layouts, a part
    of each head left unrotated)."""
    import torch

    from tessera.backends.torch.ops import rotate

    for dtype in (torch.bfloat16, torch.float16):
        x = torch.from_numpy(rng.standard_normal((3, 2, 12)).astype(np.float32)).to(dtype)
        angle = torch.from_numpy(rng.uniform(-4, 4, (3, 1, 4)))
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        for neox in (True, False):
            want = rotate(x, cos, sin, 8, neox)
            if not torch.equal(native.rope(x, cos, sin, 8, neox), want):
                return False
    return True


def attention_reference(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    rows: np.ndarray,
    q_rows: np.ndarray,
    allowed: np.ndarray | None,
    scale: float,
) -> np.ndarray:
    """What :meth:`NativeGemv.attention_rows` computes, in float64 numpy."""
    t, h, _ = q.shape
    h_kv, dv = v_cache.shape[1:]
    out = np.zeros((t, h, dv))
    for (si, j), qr in np.ndenumerate(q_rows):
        ok = rows[si] >= 0
        if allowed is not None:
            ok &= allowed[si, j]
        if qr < 0 or not ok.any():
            continue
        cells = rows[si][ok]
        for head in range(h):
            g = head // (h // h_kv)
            score = k_cache[cells, g].astype(np.float64) @ q[qr, head].astype(np.float64) * scale
            p = np.exp(score - score.max())
            out[qr, head] = p @ v_cache[cells, g].astype(np.float64) / p.sum()
    return out.reshape(t, h * dv)


def _attention_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native attention over row lists (padding, a query with no row, GQA, Dv != D, head
    sizes off the vector width) vs float64 numpy within the output dtype's rounding."""
    import torch

    rows = np.array([[0, 3, 5, -1, 7], [1, 2, -1, 4, 6]], dtype=np.int64)
    q_rows = np.array([[2, 0], [1, -1]], dtype=np.int64)
    allowed = rng.random((2, 2, 5)) < 0.7
    allowed[1, 0] = False  # ubatch row 1 reads nothing: zeros
    for dtype, step in ((torch.float32, 1e-5), (torch.bfloat16, 2.0**-8)):
        q = torch.from_numpy(rng.standard_normal((3, 4, 12)).astype(np.float32)).to(dtype)
        k = torch.from_numpy(rng.standard_normal((8, 2, 12)).astype(np.float32)).to(dtype)
        v = torch.from_numpy(rng.standard_normal((8, 2, 9)).astype(np.float32)).to(dtype)
        for mask in (allowed, None):
            got = native.attention_rows(q, k, v, RowLists(rows, q_rows, mask), 0.3)
            got = got.float().numpy()
            qn, kn, vn = (a.float().numpy() for a in (q, k, v))
            want = attention_reference(qn, kn, vn, rows, q_rows, mask, 0.3)
            if not np.all(np.abs(got - want) <= step * np.abs(want) + 1e-5):
                return False
    return True


@attrs.frozen
class NativeStatus:
    """The probe's answer for one backend: the kernels, or None and the reason why not."""

    gemv: NativeGemv | None
    reason: str


def status(backend: Any) -> NativeStatus:
    """Probe once per backend (cached in ``backend.probe_cache["native"]``)."""
    cache = backend.probe_cache
    if "native" not in cache:
        reason = _unavailable(backend)
        gemv = None
        if reason is None:
            try:
                gemv = load(build())
                reason = f"VNNI kernels from {gemv.path}"
                if not self_test(gemv):
                    gemv, reason = None, "self-test against numpy failed"
                elif gemv.amx and not tiles_ok(gemv):
                    gemv.amx = False
                    reason += "; AMX matmuls off (self-test against numpy failed)"
                elif gemv.amx:
                    reason += "; AMX matmuls"
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
                reason = f"build or load failed: {exc}"
        cache["native"] = NativeStatus(gemv, reason)
    return cache["native"]


def probe(backend: Any) -> NativeGemv | None:
    """The native kernels for a CPU torch backend, or None (see the module docstring)."""
    return status(backend).gemv


def _unavailable(backend: Any) -> str | None:
    if disabled():
        return "disabled by TESSERA_NATIVE_DISABLE"
    if getattr(backend, "torch_device", None) is None or backend.torch_device.type != "cpu":
        return "not a CPU backend"
    if getattr(backend, "dtype", None) not in COMPUTE_DTYPES:
        # int8 activations round like bf16 does; f32 keeps its exact matmuls
        return f"compute dtype {backend.dtype} keeps the exact torch paths (native: bf16/f16)"
    if not cpu_supported(cpu_flags()):
        return "the CPU lacks AVX2/FMA/F16C with AVX512-VNNI or AVX-VNNI"
    return None

"""The native kernels' C library: compiled from ``native_gemv.c``, ``native_amx.c`` and the
block types' ``native_q*.c`` (:data:`SOURCES`), with the grid types' tables generated from
``gguf.quants`` into a header at build time (:mod:`~tessera.backends.native.iq_tables`),
cached, run once in a child process, and loaded with ctypes as a
:class:`~tessera.backends.native.kernels.NativeGemv`.

The library is compiled with the system C compiler (``$CC``, default ``cc``) into
``$XDG_CACHE_HOME/tessera/native/<hash>.so`` (default ``~/.cache``), keyed by the source,
the compiler's version, the flags and the CPU's flags; it is written under a temporary
name and renamed, so concurrent processes and crashes never leave a half-written library.
The generated header's text is part of the key; it is written next to the temporary
library for the compiler (``-I``) and removed with it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tessera.backends.native import cpu_paths, iq_tables
from tessera.backends.native.attention_kv import declare_attention_kv
from tessera.backends.native.dense_gemv import declare_dense
from tessera.backends.native.kernels import NativeGemv
from tessera.backends.native.portable_gemv import declare_portable
from tessera.backends.native.q4_0_x4 import declare_q4_0_x4
from tessera.backends.native.vnni_gemm import declare_vnni_gemm
from tessera.switches import OFF, Switch, choose

_HERE = Path(__file__).parent
#: The C files compiled together into the one library: Q4_0/Q8_0 and the other native
#: kernels, the AMX prefill matmuls and the int8 VNNI ones for CPUs without AMX, the other
#: block types' GEMV, dot products and dequantization; and the headers they include (part
#: of the cache key).
SOURCES = tuple(
    _HERE / name
    for name in ("native_gemv.c", "native_amx.c", "native_qgemv.c", "native_qdot_legacy.c")
    + ("native_qdot_k.c", "native_qdot_low.c", "native_qdequant.c", "native_dense_gemv.c")
    + ("native_attention.c", "native_qgemv_portable.c", "native_isa.c", "native_qdot_iq.c")
    + ("native_q4_0_x4.c", "native_vnni_gemm.c")
)
HEADERS = (_HERE / "native_common.h", _HERE / "native_quant.h", _HERE / "native_iq.h",
           _HERE / "native_transpose.h")  # fmt: skip
NATIVE_AMX_DISABLE = Switch(
    "TESSERA_NATIVE_AMX_DISABLE",
    "Q4_0/Q8_0/BF16/F16 matmuls of 16 rows or more and the fused gate/up SwiGLU stay off "
    "the AMX tiles (the other native kernels stay on)",
    OFF,
)
#: The variable's name, for callers that set it.
AMX_DISABLE_ENV = NATIVE_AMX_DISABLE.name
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
#: All of these must be in /proc/cpuinfo's flags; one of VNNI_FLAG_SETS gives the integer
#: dot products their VNNI instruction (else AVX2's vpmaddubsw path).
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
VNNI_FLAG_SETS = (("avx512_vnni", "avx512vl"), ("avx_vnni",))
ABI = 7


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first CPU's flags in ``cpuinfo`` (empty where none are listed)."""
    return set((cpu_paths.cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_supported(flags: set[str]) -> bool:
    return all(f in flags for f in REQUIRED_CPU_FLAGS)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "tessera" / "native"


def build(cc: str | None = None, flags: tuple[str, ...] = CFLAGS) -> Path:
    """Compile the library (or find it in the cache); raises OSError/RuntimeError on failure.

    ``flags`` other than :data:`CFLAGS` serve tests: ``-mno-avx512f`` for the 256-bit path
    of CPUs with AVX-VNNI only, ``-mno-avx512f -mno-avxvnni`` for the AVX2 path."""
    cc = cc or os.environ.get("CC", "").strip() or "cc"
    version = subprocess.run(
        [cc, "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    key = hashlib.sha256()
    parts = [p.read_bytes() for p in SOURCES + HEADERS] + [iq_tables.header_text().encode()]
    for part in (*parts, version.encode(), " ".join(flags).encode()):
        key.update(part)
    key.update(" ".join(sorted(cpu_flags())).encode())
    target = cache_dir() / f"gemv-{key.hexdigest()[:24]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        tmp = os.path.join(work, "gemv.so")
        iq_tables.write_header(Path(work))
        done = subprocess.run(
            [cc, *flags, f"-I{work}", "-o", tmp, *map(str, SOURCES)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: readers see no library or a whole one
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
ws, n_outs = (ctypes.c_void_p * 1)(ctypes.addressof(w)), (ctypes.c_int64 * 1)(2)
lib.tsr_gemv_quant.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3
lib.tsr_gemv_quant.argtypes += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
lib.tsr_gemv_quant.argtypes += [ctypes.c_int, ctypes.c_int]
lib.tsr_dequant_quant.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
lib.tsr_dequant_quant.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
for t in (3, 6, 7, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 29, 34, 35, 39, 40):
    assert lib.tsr_gemv_quant(t, 1, ws, n_outs, None, 256, x, 1, y, 0, 2)
    assert lib.tsr_dequant_quant(t, w, 1, 256, x, 1, 2)
lib.tsr_gemv_dense.argtypes = lib.tsr_gemv_quant.argtypes
for t in (1, 30):
    assert lib.tsr_gemv_dense(t, 1, ws, n_outs, None, 64, x, 3, y, 0, 2)
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


def load(path: Path, portable: bool = False) -> NativeGemv:
    """The library at ``path`` loaded, its AMX and int8-GEMM choices made; ``portable``: the
    quantized decode GEMV on its plain C loops (``TESSERA_NATIVE_PATH=portable``)."""
    check_runs(path)
    lib = ctypes.CDLL(str(path))
    if lib.tsr_native_abi() != ABI:
        raise RuntimeError(f"{path} is not a build of ABI {ABI}")
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
    args = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p]
    args += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.tsr_gemv_quant.argtypes, lib.tsr_gemv_quant.restype = args, ctypes.c_int
    args = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.tsr_dequant_quant.argtypes = args + [ctypes.c_int, ctypes.c_int]
    lib.tsr_dequant_quant.restype = ctypes.c_int
    lib.tsr_quant_row_bytes.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.tsr_quant_row_bytes.restype = ctypes.c_int64
    lib.tsr_amx_scratch_bytes.argtypes = [ctypes.c_int64]
    lib.tsr_amx_scratch_bytes.restype = ctypes.c_int64
    declare_dense(lib)
    declare_attention_kv(lib)
    declare_portable(lib)
    declare_q4_0_x4(lib)
    declare_vnni_gemm(lib)
    # (GGML type, weight(s), n_out, n_in, x, rows, y, scratch, threads)
    after_weights = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    after_weights += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    for suffix in ("", "_f32"):  # y bf16 or float32 (float32 activations)
        matmul, swiglu = (
            getattr(lib, f"tsr_matmul_amx{suffix}"),
            getattr(lib, f"tsr_swiglu_amx{suffix}"),
        )
        matmul.argtypes = [ctypes.c_int, ctypes.c_void_p] + after_weights
        swiglu.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + after_weights
        matmul.restype = swiglu.restype = ctypes.c_int
    native = NativeGemv(lib, path)
    native.isa = lib.tsr_native_isa()

    def amx_probe() -> tuple[bool, str]:
        if not lib.tsr_native_amx():
            return False, "built without AMX tiles (CPU or compiler)"
        # the OS grants the tile state on request (tsr_amx_init, once per process)
        if not lib.tsr_amx_init():
            return False, "the OS did not grant the AMX tile state"
        return True, "AMX tiles for 16 rows or more"

    native.amx_choice = choose(NATIVE_AMX_DISABLE, amx_probe, on="on", off="off")
    native.amx = native.amx_choice.path == "on"
    native.portable = portable
    native.choose_vnni_gemm(native.amx, portable)
    return native

"""Which code path the native kernels take on this CPU, and the switch that forces one.

The library is compiled for the CPU (``-march=native``); each C file picks its widest path
by the compiler's macros, which ``tsr_native_isa()`` reports back as bits (:data:`ISA_BITS`).
``TESSERA_NATIVE_PATH`` (:data:`NATIVE_PATH`) forces a narrower one: ``avx-vnni`` and
``avx2`` build the library with ``-mno-avx512f`` (and ``-mno-avxvnni``), ``portable``
keeps that build and routes the quantized decode GEMV to its plain C loops
(``native_qgemv_portable.c``). A path the CPU lacks is refused in the probe's reason and
the widest one taken instead, so a forced path never runs an illegal instruction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.switches import CHOICE, Switch, text

#: What the quantized decode matmuls run where no native path serves a type.
FALLBACK = "torch fallback"
#: The paths, widest first; ``auto`` takes the widest this CPU and compiler give.
PATHS = ("auto", "avx512-vnni", "avx-vnni", "avx2", "portable")
NATIVE_PATH = Switch(
    "TESSERA_NATIVE_PATH",
    "the native kernels' code path: auto (the CPU's widest), avx512-vnni, avx-vnni or avx2 "
    "(the library built without the wider instructions), portable (the quantized decode "
    "GEMV in plain C loops)",
    CHOICE,
    default="auto",
    choices=PATHS,
)
#: Compiler flags that take a path's wider instructions away (added to the library's).
NARROWING_FLAGS = {
    "avx512-vnni": (),
    "avx-vnni": ("-mno-avx512f",),
    "avx2": ("-mno-avx512f", "-mno-avxvnni"),
}
#: /proc/cpuinfo flags a forced path needs (AVX2, FMA and F16C every path needs).
PATH_CPU_FLAGS = {
    "avx512-vnni": ("avx512_vnni", "avx512bw", "avx512vl"),
    "avx-vnni": ("avx_vnni",),
    "avx2": (),
}
#: What each bit of ``tsr_native_isa()`` says the build was compiled for.
ISA_BITS = {
    "avx2": 1, "avx512f": 2, "avx512-vnni": 4, "vnni-256": 8, "avx512-bf16": 16, "amx": 32,
}  # fmt: skip
#: /proc/cpuinfo flags that decide the kernels' paths, as ``tessera plugins`` names them.
CPU_FEATURES = {
    "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "avx512f": "AVX512F", "avx512bw": "AVX512BW",
    "avx512vl": "AVX512VL", "avx512_vnni": "AVX512-VNNI", "avx512_bf16": "AVX512-BF16",
    "avx_vnni": "AVX-VNNI", "amx_tile": "AMX-TILE", "amx_bf16": "AMX-BF16",
}  # fmt: skip


def cpuinfo_field(key: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The value of the first ``key`` line of ``cpuinfo`` (the first CPU's), stripped; None
    where the file or the line is missing."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name as ``lscpu`` shows it ("unknown CPU" where none is listed)."""
    return cpuinfo_field("model name", cpuinfo) or "unknown CPU"


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``), "" where unknown."""
    return cpuinfo_field("vendor_id", cpuinfo) or ""


def cpu_features(flags: set[str]) -> str:
    """The features of :data:`CPU_FEATURES` the CPU has, and which of them it lacks."""
    have = [name for flag, name in CPU_FEATURES.items() if flag in flags]
    lacks = [name for flag, name in CPU_FEATURES.items() if flag not in flags]
    return " ".join(have) + (f"; lacks {' '.join(lacks)}" if lacks else "")


def forced_path(flags: set[str]) -> tuple[str, str]:
    """``(path, why)``: the path ``TESSERA_NATIVE_PATH`` asks for, or ``auto`` with the
    reason when it is unset or asks for instructions this CPU lacks."""
    asked = text(NATIVE_PATH) or "auto"
    if asked == "auto":
        return "auto", "the widest path of this CPU and compiler (-march=native)"
    missing = [f for f in PATH_CPU_FLAGS.get(asked, ()) if f not in flags]
    if missing:
        why = f"{NATIVE_PATH.name}={asked} refused: the CPU lacks {', '.join(missing)}"
        return "auto", f"{why}; the widest path instead"
    return asked, f"forced by {NATIVE_PATH.name}={asked}"


def build_flags(path: str, base: tuple[str, ...]) -> tuple[str, ...]:
    """The compiler flags of the library for ``path`` (``auto``/``portable``: ``base``)."""
    return base + NARROWING_FLAGS.get(path, ())


def has(isa: int, name: str) -> bool:
    """Whether the build's ``tsr_native_isa()`` bits include ``name`` of :data:`ISA_BITS`."""
    return bool(isa & ISA_BITS[name])


def quant_path(isa: int, portable: bool) -> str:
    """The quantized decode GEMV's code path in a build with ``isa`` bits."""
    if portable:
        return "portable"
    if has(isa, "avx512-vnni"):
        return "avx512-vnni"
    return "avx-vnni" if has(isa, "vnni-256") else "avx2"


def attention_path(isa: int) -> str:
    """The native decode attention's code path: 512-bit tiles or 256-bit FMA."""
    return "avx512f" if has(isa, "avx512f") else "avx2"


def describe(gemv: Any) -> str:
    """One line for a loaded library: its paths, its AMX state and where it is."""
    quant, attention = quant_path(gemv.isa, gemv.portable), attention_path(gemv.isa)
    return f"quant GEMV {quant}, attention {attention}; AMX matmuls {gemv.amx_choice}; {gemv.path}"

"""Whether a backend gets the native kernels, and the reason why not: the entry the torch
backend and the weight kernels use (:func:`probe`, :func:`status`).

Capability probe (:func:`probe`, cached per backend in ``backend.probe_cache``): the CPU
has AVX2/FMA/F16C (the integer dot products use AVX512-VNNI or AVX-VNNI where it has them),
a compiler runs, the library builds, runs once in a child process (so an illegal
instruction cannot kill the caller), loads, and a self-test on random weights agrees with
numpy within the error bound of int8 activations. Otherwise the weight kernels keep their
torch paths. ``TESSERA_NATIVE_DISABLE=1`` (:data:`NATIVE_DISABLE`) switches it off; the
choice is recorded as the backend's ``"native kernels"`` path (:meth:`Backend.record_path`),
the AMX part of it as ``"native AMX matmuls"`` and the int8 prefill GEMM of CPUs without
AMX as ``"native VNNI prefill GEMM"`` (:mod:`~tessera.backends.native.vnni_gemm`).
:func:`serves` answers for one block type of
:data:`~tessera.backends.native.typed_gemv.GGML_TYPES`, which
``TESSERA_NATIVE_QUANT_DISABLE`` (:data:`NATIVE_QUANT_DISABLE`) can take off one by one;
``TESSERA_NATIVE_PATH`` (:mod:`~tessera.backends.native.cpu_paths`) forces a code path.
"""

from __future__ import annotations

import subprocess
from typing import Any

import attrs

from tessera.backends.native import cpu_paths, library, selftest
from tessera.backends.native.kernels import NativeGemv
from tessera.backends.native.portable_gemv import PORTABLE_TYPES
from tessera.backends.native.typed_gemv import GGML_TYPES
from tessera.backends.native.vnni_gemm import vnni_gemm_ok
from tessera.switches import NAMES, OFF, Choice, Switch, choose, names

#: Compute dtypes the kernels serve: rounding activations to int8 blocks costs about what
#: bf16 rounding does (|error| <= max|block| / 254 per value), so f32 asked for by name
#: keeps exact matmuls; f32 as the default of a CPU without fast bf16 takes the kernels.
COMPUTE_DTYPES = ("bf16", "f16")

NATIVE_DISABLE = Switch(
    "TESSERA_NATIVE_DISABLE",
    "no native CPU kernels (C, built on first use): every op on torch's kernels instead",
    OFF,
)

NATIVE_QUANT_DISABLE = Switch(
    "TESSERA_NATIVE_QUANT_DISABLE",
    "block types (e.g. Q4_K,Q5_0; all: every one) whose weights stay off the native "
    f"decode and dequantization kernels of {', '.join(GGML_TYPES)}: their torch paths instead",
    NAMES,
)


@attrs.frozen
class NativeStatus:
    """The probe's answer for one backend: the kernels, or None and the reason why not."""

    gemv: NativeGemv | None
    reason: str


def status(backend: Any) -> NativeStatus:
    """Probe once per backend (cached in ``backend.probe_cache["native"]``)."""
    cache = backend.probe_cache
    if "native" not in cache:
        probed = NativeStatus(None, "")

        def probe() -> tuple[bool, str]:
            nonlocal probed  # the probe's product, the loaded library, is kept
            probed = _probe(backend)
            return probed.gemv is not None, probed.reason

        choice = choose(NATIVE_DISABLE, probe, on="native", off="torch")
        backend.record_path("native kernels", choice)
        if probed.gemv is not None:
            backend.record_path("native AMX matmuls", probed.gemv.amx_choice)
            backend.record_path("native VNNI prefill GEMM", probed.gemv.vnni_gemm_choice)
        cache["native"] = NativeStatus(probed.gemv, choice.reason)
    return cache["native"]


def _probe(backend: Any) -> NativeStatus:
    """The kernels for ``backend`` once built, loaded and self-tested, or why not."""
    unavailable = _unavailable(backend)
    if unavailable is not None:
        return NativeStatus(None, unavailable)
    path, why = cpu_paths.forced_path(library.cpu_flags())
    try:
        flags = cpu_paths.build_flags(path, library.CFLAGS)
        gemv = library.load(library.build(flags=flags), portable=path == "portable")
        gemv.path_reason = f"{why}; self-test passed"
        if not selftest.self_test(gemv):
            return NativeStatus(None, "self-test against numpy failed")
        if gemv.amx and not selftest.tiles_ok(gemv):
            gemv.amx = False
            gemv.amx_choice = Choice("off", "self-test against numpy failed")
            gemv.choose_vnni_gemm(amx=False, portable=gemv.portable)
        if gemv.vnni_gemm and not vnni_gemm_ok(gemv):
            gemv.vnni_gemm = False
            gemv.vnni_gemm_choice = Choice("off", "self-test against numpy failed")
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        return NativeStatus(None, f"build or load failed: {exc}")
    return NativeStatus(gemv, f"{cpu_paths.describe(gemv)}; {gemv.path_reason}")


def probe(backend: Any) -> NativeGemv | None:
    """The native kernels for a CPU torch backend, or None (see the module docstring)."""
    return status(backend).gemv


def serves(backend: Any, kind: str) -> NativeGemv | None:
    """The native kernels when they take ``kind`` weights (a type of ``GGML_TYPES``) on
    ``backend``: the probe passes, ``TESSERA_NATIVE_QUANT_DISABLE`` does not name it and the
    forced path has a kernel for it; recorded once per type as the backend's
    ``"quant decode GEMV <kind>"`` path: the code path, or the quant plugin's torch path."""
    key = f"quant decode GEMV {kind}"
    cache = backend.probe_cache
    if key not in cache:
        listed = {n.upper() for n in names(NATIVE_QUANT_DISABLE)} & {kind.upper(), "ALL"}
        gemv = None if listed or kind not in GGML_TYPES else probe(backend)
        if listed:
            why = f"disabled by {NATIVE_QUANT_DISABLE.name}={NATIVE_QUANT_DISABLE.raw()}"
        elif kind not in GGML_TYPES:
            why = f"no native kernel for {kind}"
        elif gemv is None:
            why = status(backend).reason
        elif gemv.portable and kind not in PORTABLE_TYPES:
            why = f"no portable kernel for {kind} ({cpu_paths.NATIVE_PATH.name}=portable)"
            gemv = None
        else:
            why = gemv.path_reason
        path = cpu_paths.quant_path(gemv.isa, gemv.portable) if gemv else cpu_paths.FALLBACK
        backend.record_path(key, Choice(path, why))
        cache[key] = gemv
    return cache[key]


def _unavailable(backend: Any) -> str | None:
    if getattr(backend, "torch_device", None) is None or backend.torch_device.type != "cpu":
        return "not a CPU backend"
    dtype = getattr(backend, "dtype", None)
    if dtype not in COMPUTE_DTYPES and (dtype != "f32" or getattr(backend, "exact_f32", True)):
        # int8 activations round like bf16 does; f32 asked for keeps its exact matmuls
        return (
            f"compute dtype {dtype} keeps the exact torch paths (native: bf16/f16, or f32 "
            "as the default of a CPU without fast bf16)"
        )
    if not library.cpu_supported(library.cpu_flags()):
        return "the CPU lacks AVX2, FMA or F16C"
    return None

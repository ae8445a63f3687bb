"""Whether a backend gets the native kernels, and the reason why not: the entry the torch
backend and the weight kernels use (:func:`probe`, :func:`status`).

Capability probe (:func:`probe`, cached per backend in ``backend.probe_cache``): the CPU
has AVX2/FMA/F16C and AVX512-VNNI (with VL) or AVX-VNNI, a compiler runs, the library
builds, runs once in a child process (so an illegal instruction cannot kill the caller),
loads, and a self-test on random weights agrees with numpy within the error bound of
int8 activations. Otherwise the weight kernels keep their torch paths.
``TESSERA_NATIVE_DISABLE=1`` switches it off.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import attrs

from tessera.backends.native import library, selftest
from tessera.backends.native.kernels import NativeGemv

#: Compute dtypes the kernels serve: rounding activations to int8 blocks costs about what
#: bf16 rounding does (|error| <= max|block| / 254 per value), so f32 keeps exact matmuls.
COMPUTE_DTYPES = ("bf16", "f16")


def disabled() -> bool:
    """Whether ``TESSERA_NATIVE_DISABLE`` switches the native kernels off."""
    return os.environ.get("TESSERA_NATIVE_DISABLE", "").strip() not in ("", "0")


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
                gemv = library.load(library.build())
                reason = f"VNNI kernels from {gemv.path}"
                if not selftest.self_test(gemv):
                    gemv, reason = None, "self-test against numpy failed"
                elif gemv.amx and not selftest.tiles_ok(gemv):
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
    if not library.cpu_supported(library.cpu_flags()):
        return "the CPU lacks AVX2/FMA/F16C with AVX512-VNNI or AVX-VNNI"
    return None

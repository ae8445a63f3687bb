"""Which of the torch backend's dense weights decode on the native 16-bit GEMV
(:mod:`tessera.backends.native.dense_gemv`): plain 2-D bf16/f16 CPU tensors (F16/BF16 files,
and the types a backend dequantized at load) in matmuls of fewer than
:data:`~tessera.backends.native.dense_gemv.NATIVE_DENSE_MAX_ROWS` rows.

The choice is made once per backend: the native kernels' probe and the dense kernel's
self-test (:func:`~tessera.backends.native.dense_selftest.dense_ok`), then
``TESSERA_NATIVE_DENSE_DISABLE`` (:data:`~tessera.backends.native.dense_gemv.NATIVE_DENSE_DISABLE`),
recorded as the backend's ``"native dense matmuls"`` path; everything else keeps
``F.linear``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from tessera.backends.native.cpu_paths import cpu_vendor
from tessera.backends.native.dense_gemv import (
    F16_IN_PLACE_DISABLE,
    NATIVE_CONVERT_DISABLE,
    NATIVE_DENSE_DISABLE,
    NATIVE_DENSE_MAX_ROWS,
)
from tessera.backends.native.dense_selftest import convert_ok, dense_ok
from tessera.backends.native.library import cpu_flags
from tessera.switches import CHOICE, Choice, Switch, choose, text

#: The GGML format of each 16-bit torch dtype the GEMV reads.
DENSE_KINDS = {torch.bfloat16: "BF16", torch.float16: "F16"}
F32_PREFILL = Switch(
    "TESSERA_TORCH_F32_PREFILL",
    "bf16 on CPU with float32 activations: 16-bit dense weights multiply prefill rows in "
    "float32 (widened per matmul); auto (where oneDNN's bf16 matmul runs without AMX on a "
    "CPU whose bf16 dot product is not faster than float32: Intel), 1, or 0 (bf16)",
    CHOICE,
    default="auto",
    choices=("auto", "1", "0"),
)


def dense_native(backend: Any) -> Any:
    """The native kernels when they serve ``backend``'s dense weights, else None (chosen
    once, kept in ``backend.probe_cache["native dense"]``)."""
    cache = backend.probe_cache
    if "native dense" not in cache:

        def probe() -> tuple[bool, str]:
            gemv = backend._native()
            if gemv is None:
                return False, f"no native kernels ({cache['native'].reason})"
            if not dense_ok(gemv):
                return False, "the dense GEMV's self-test against numpy failed"
            return True, f"{gemv.dense_path()} GEMV below {NATIVE_DENSE_MAX_ROWS} rows"

        choice = choose(NATIVE_DENSE_DISABLE, probe, on="native", off="torch")
        backend.record_path("native dense matmuls", choice)
        cache["native dense"] = backend._native() if choice.path == "native" else None
    return cache["native dense"]


def dense_gemv(backend: Any, w: torch.Tensor, n_rows: int) -> tuple[str, torch.Tensor] | None:
    """``(kind, w)`` when a matmul of ``n_rows`` rows by the plain tensor ``w`` runs the native
    dense GEMV (``kind`` ``"BF16"`` or ``"F16"``), else None (also for no rows: a pruned
    layer's empty matmul is torch's)."""
    if not 0 < n_rows < NATIVE_DENSE_MAX_ROWS or w.dim() != 2 or w.device.type != "cpu":
        return None
    kind = DENSE_KINDS.get(w.dtype)
    if kind is None or not w.is_contiguous() or dense_native(backend) is None:
        return None
    return kind, w


def f16_to_bf16(backend: Any, values: torch.Tensor) -> torch.Tensor:
    """The float16 CPU tensor ``values`` (an F16 file's weight) as bfloat16: converted by
    the native kernels where their probe and self-test pass (torch's cast took ~4 ns per
    value and thread: 1.9 s of CPU for a 0.5B model's start), else by torch. Chosen once
    per backend (``TESSERA_NATIVE_CONVERT_DISABLE``), recorded as its ``"F16 weights to
    bf16"`` path."""
    cache = backend.probe_cache
    if "native convert" not in cache:

        def probe() -> tuple[bool, str]:
            gemv = backend._native()
            if gemv is None:
                return False, f"no native kernels ({cache['native'].reason})"
            if not convert_ok(gemv):
                return False, "the native conversion's self-test against torch's cast failed"
            return True, "native: every value widened and rounded once, on every thread"

        choice = choose(NATIVE_CONVERT_DISABLE, probe, on="native", off="torch")
        backend.record_path("F16 weights to bf16", choice)
        cache["native convert"] = backend._native() if choice.path == "native" else None
    native = cache["native convert"]
    if native is None or not values.is_contiguous():
        return values.to(torch.bfloat16)
    return native.f16_to_bf16(values)


def f16_in_place(backend: Any) -> bool:
    """Whether an F16 file's weights stay as the file's values on the bf16 ``backend``: where
    the AMX tiles (rounding each block to bf16 as it enters a tile) or float32 matmuls
    (:func:`f32_prefill`) take its prefill and the dense GEMV its decode rows, so nothing
    is converted at load (0.27 s and 2 bytes per weight for a 0.5B model) and decode reads
    the exact values. Elsewhere (torch's bf16 matmul would convert them every time) they
    are converted once at load.
    Chosen once per backend (``TESSERA_F16_IN_PLACE_DISABLE``), recorded as its ``"F16
    weights"`` path."""
    cache = backend.probe_cache
    if "f16 in place" not in cache:

        def probe() -> tuple[bool, str]:
            native = dense_native(backend)
            if native is None:
                return False, f"no native dense GEMV ({backend.paths['native dense matmuls']})"
            if f32_prefill(backend):
                return True, "the file's values: float32 prefill matmuls, the dense GEMV for decode"
            if not native.amx:
                return False, f"no AMX tiles for prefill ({native.amx_choice})"
            return True, "the file's values: AMX tiles for prefill, the dense GEMV for decode"

        choice = choose(F16_IN_PLACE_DISABLE, probe, on="in place", off="converted to bf16")
        backend.record_path("F16 weights", choice)
        cache["f16 in place"] = choice.path == "in place"
    return cache["f16 in place"]


def onednn_bf16_on_amx(flags: set[str]) -> bool:
    """Whether oneDNN's bf16 matmuls run on AMX tiles here: the CPU has AMX-BF16 and no
    ``ONEDNN_MAX_CPU_ISA`` (older name ``DNNL_MAX_CPU_ISA``) cap below it (e.g.
    ``AVX512_CORE_BF16``, how AMX is switched off)."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "") or os.environ.get("DNNL_MAX_CPU_ISA", "")
    cap = cap.strip().upper()
    return "amx_bf16" in flags and (cap in ("", "ALL", "DEFAULT") or "AMX" in cap)


def _float32_is_faster(backend: Any, flags: set[str]) -> tuple[bool, str]:
    native = dense_native(backend)
    if native is not None and native.amx:
        return False, "the native AMX tiles take prefill"
    if onednn_bf16_on_amx(flags):
        return False, "oneDNN's bf16 matmuls run on AMX"
    if "avx512_bf16" in flags and cpu_vendor() != "GenuineIntel":
        return False, "AVX512-BF16 at twice the float32 rate"
    return True, "bf16 matmuls without AMX are slower than float32 on this CPU"


def f32_prefill(backend: Any) -> bool:
    """Whether the bf16 ``backend`` (float32 activations, CPU) multiplies prefill rows by its
    16-bit dense weights (F16/BF16 files, types dequantized at load) in float32: each weight
    widened per matmul (exact), x's float32 activations unrounded. Chosen where the native
    AMX tiles do not take them and oneDNN's bf16 matmul runs without AMX on a CPU whose
    AVX512-BF16 dot product is no faster than float32 FMAs: Intel's ``vdpbf16ps`` issues on
    one port, its FMAs on two (512x896 by 4864x896, 2 threads, Xeon family 6 model 167 with
    AMX capped off: bf16 225, float32 with the widening 340 GFLOP/s), where AMD Zen 4/5 do
    twice the float32 rate in bf16. Chosen once per backend (``TESSERA_TORCH_F32_PREFILL``;
    ``1`` also keeps these weights off the tiles), recorded as its ``"16-bit prefill"``
    path."""
    cache = backend.probe_cache
    if "f32 prefill" not in cache:
        on = False  # on GPUs and in one compute dtype throughout, nothing to choose
        if backend.device == "cpu" and backend.act_dtype != backend.torch_dtype:
            forced = text(F32_PREFILL)
            if forced != "auto":
                on, reason = forced == "1", f"{F32_PREFILL.name}={forced}"
            else:
                on, reason = _float32_is_faster(backend, cpu_flags())
            backend.record_path("16-bit prefill", Choice("float32" if on else "bf16", reason))
        cache["f32 prefill"] = on
    return cache["f32 prefill"]

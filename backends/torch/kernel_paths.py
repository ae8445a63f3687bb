"""The torch backend's CPU kernel paths, one line per kernel family, recorded once per
backend as its paths (``Backend.paths``, listed by ``tessera plugins`` and ``-v``): the CPU
and the features the kernels' paths depend on, then for each family the code path taken
and why (the probe's answer, the self-test, the switch that forced or turned it off).

Families: the quantized decode GEMV (per type), the prefill tiles (AMX), the dense
F16/BF16 decode GEMV, the decode attention and the KV cache types it reads.
"""

from __future__ import annotations

from typing import Any

from tessera.backends.native import cpu_paths, library
from tessera.backends.native.attention_kv import KV_TYPE_CODES
from tessera.backends.torch.dense_native import dense_native
from tessera.switches import Choice

#: The dense GEMV's paths by ``tsr_dense_path()``, as the other families name theirs.
DENSE_PATH_NAMES = {2: "avx512-bf16", 1: "avx512f", 0: "avx2"}
#: What the families run where the native kernels do not.
FALLBACKS = {
    "quant": cpu_paths.FALLBACK,
    "tiles": "dequantize + torch matmul",
    "dense": "torch matmul",
    "attention": "SDPA",
}


def record_kernel_paths(backend: Any) -> None:
    """Record every family's path on ``backend`` (a CPU torch backend whose native probe
    has run); on other devices nothing is recorded."""
    if backend.torch_device.type != "cpu" or "kernel paths" in backend.probe_cache:
        return
    backend.probe_cache["kernel paths"] = True
    flags = library.cpu_flags()
    backend.record_path("CPU", Choice(cpu_paths.cpu_model(), cpu_paths.cpu_features(flags)))
    status = backend.probe_cache["native"]
    gemv = status.gemv
    for what, choice in _family_choices(backend, gemv, status.reason):
        backend.record_path(what, choice)


def _family_choices(backend: Any, gemv: Any, reason: str) -> list[tuple[str, Choice]]:
    off = f"no native kernels ({reason})"
    if gemv is None:
        return [
            ("quant decode GEMV", Choice(FALLBACKS["quant"], off)),
            ("prefill tiles", Choice(FALLBACKS["tiles"], off)),
            ("dense F16/BF16 GEMV", Choice(FALLBACKS["dense"], off)),
            ("decode attention", Choice(FALLBACKS["attention"], off)),
            ("KV types", Choice("f32, bf16, f16, q8_0", "SDPA reads q8_0 as dequantized rows")),
        ]
    path = cpu_paths.quant_path(gemv.isa, gemv.portable)
    choices = [("quant decode GEMV", Choice(path, gemv.path_reason))]
    for kind in ("Q8_0", "Q4_0"):  # the other types record theirs when asked (probe.serves)
        choices.append((f"quant decode GEMV {kind}", Choice(path, gemv.path_reason)))
    tiles = "amx-bf16" if gemv.amx else FALLBACKS["tiles"]
    choices.append(("prefill tiles", Choice(tiles, gemv.amx_choice.reason)))
    dense = dense_native(backend) is not None
    dense_why = backend.paths["native dense matmuls"].reason
    dense_path = DENSE_PATH_NAMES[gemv.lib.tsr_dense_path()] if dense else FALLBACKS["dense"]
    choices.append(("dense F16/BF16 GEMV", Choice(dense_path, dense_why)))
    attention = cpu_paths.attention_path(gemv.isa)
    why = "native kernels' probe; off: TESSERA_NATIVE_DISABLE=1"
    choices.append(("decode attention", Choice(attention, why)))
    kv = ", ".join(KV_TYPE_CODES)
    choices.append(("KV types", Choice(kv, "read in place by the native decode attention")))
    return choices

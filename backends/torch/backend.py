"""The torch backend plugin (CPU and CUDA): registration and device/dtype choice.

This entry-point module stays light: torch and the backend class
(:mod:`tessera.backends.torch.ops`) are imported only when a backend is created.

Choice of settings, in order: an explicit ``device`` / ``dtype`` argument; for the dtype,
the ``TESSERA_TORCH_DTYPE`` environment variable; otherwise the device is ``cuda`` when
torch sees a GPU, else ``cpu``, and the dtype is ``bf16`` where bf16 matmul is fast (a GPU
that supports bf16, or a CPU with AMX-bf16 or AVX512-bf16 units) and ``f32`` elsewhere.

The torch backend's switches are declared here, light, with those of its other modules
(which import torch), so that listing them (``tessera plugins --switches``) needs no torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.contract.backend import BackendInfo
from tessera.contract.fusion import LLAMA_DECODER, BlockFusion
from tessera.errors import SwitchValueError, UnknownBackendError
from tessera.hookspecs import hookimpl
from tessera.switches import CHOICE, ON, Choice, Switch, text

TESSERA_PLUGIN_API = 2

#: Accepted dtype spellings and the canonical name the backend reports.
DTYPE_NAMES = {
    "f32": "f32",
    "float32": "f32",
    "fp32": "f32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f16": "f16",
    "float16": "f16",
    "fp16": "f16",
}

TORCH_DTYPE = Switch(
    "TESSERA_TORCH_DTYPE",
    "compute dtype of the torch backend: f32, bf16 or f16 (default: bf16 where fast, else f32)",
    CHOICE,
    choices=tuple(DTYPE_NAMES),
)
PACKED_LINEAR = Switch(
    "TESSERA_TORCH_PACKED_LINEAR",
    "torch linear on oneDNN weights packed once with fused GELU / residual (bf16/f16 CPU); "
    "0: F.linear",
    ON,
    default=True,
)
FUSED_NORM = Switch(
    "TESSERA_TORCH_FUSED_NORM",
    "RMSNorm on torch's fused F.rms_norm; 0: composed of elementwise ops",
    ON,
    default=True,
)
INFERENCE_MODE = Switch(
    "TESSERA_TORCH_INFERENCE_MODE",
    "forward passes that ask the backend's forward_scope run in torch.inference_mode(); 0: not",
    ON,
    default=True,
)
F32_ACTIVATIONS = Switch(
    "TESSERA_TORCH_F32_ACTIVATIONS",
    "bf16 on CPU keeps activations (residual stream, norms, attention and FFN outputs, "
    "logits) in float32, each matmul's input rounded to bf16 (the default); 0: every "
    "activation in bf16 (KLD vs f32 0.000016 -> 0.000105)",
    ON,
    default=True,
)
F32_ATTENTION = Switch(
    "TESSERA_TORCH_F32_ATTENTION",
    "bf16 on CPU with float32 activations: prefill attention (SDPA) in float32, q unrounded "
    "and K/V widened, instead of bf16 (mean KLD vs f32 on an F16 file 0.000015 -> 0.000009; "
    "prefill 20-55% slower)",
    ON,
    default=False,
)
CHUNKED_DELTA = Switch(
    "TESSERA_TORCH_CHUNKED_DELTA",
    "gated delta rule over a prompt in chunks of 64 tokens (a few matmuls per chunk, as "
    "llama.cpp prefills); 0: token by token",
    ON,
    default=True,
)

#: CPU flags of units that make torch's bf16 matmul faster than f32 (oneDNN uses them).
FAST_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
FAST_BF16 = Switch(
    "TESSERA_TORCH_FAST_BF16",
    "whether the CPU counts as one with fast bf16 units (AMX-BF16 or AVX512-BF16), which "
    "makes bf16 the default compute dtype: auto (read from the CPU), 1, or 0 (f32 by "
    "default with the native kernels, as on CPUs without them: AVX2 laptops)",
    CHOICE,
    default="auto",
    choices=("auto", "1", "0"),
)


def cpu_has_fast_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has AMX-bf16 or AVX512-bf16 (read from /proc/cpuinfo where present),
    unless ``TESSERA_TORCH_FAST_BF16`` (:data:`FAST_BF16`) says 1 or 0."""
    import torch

    forced = text(FAST_BF16)
    if forced != "auto":
        return forced == "1"
    from tessera.backends.native.cpu_paths import cpuinfo_field

    if "AMX" in torch.backends.cpu.get_cpu_capability().upper():
        return True
    flags = (cpuinfo_field("flags", cpuinfo) or "").split()
    return any(flag in flags for flag in FAST_BF16_CPU_FLAGS)


def pick_device(device: str | None) -> Any:
    """A ``torch.device`` for ``device`` (None: cuda if available); error if unusable here."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UnknownBackendError(
            f"the torch backend does not know device '{device}'; use 'cpu' or 'cuda[:N]'"
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UnknownBackendError(
                f"device '{device}' asked for, but torch sees no CUDA GPU here; use 'cpu' or "
                "install a CUDA build of torch"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UnknownBackendError(
                f"device '{device}' does not exist; this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)"
            )
    elif dev.type != "cpu":
        raise UnknownBackendError(f"the torch backend runs on 'cpu' or 'cuda', not '{device}'")
    return dev


def pick_dtype(dtype: str | None, device: Any) -> str:
    """The canonical compute dtype: argument, else TESSERA_TORCH_DTYPE, else the fast one."""
    import torch

    asked = dtype
    if asked is None:
        try:
            asked = text(TORCH_DTYPE)
        except SwitchValueError as exc:  # as a bad dtype argument: the backend cannot run so
            raise UnknownBackendError(str(exc)) from exc
    if asked:
        if asked.lower() not in DTYPE_NAMES:
            raise UnknownBackendError(
                f"the torch backend does not compute in '{asked}'; use one of f32, bf16, f16"
            )
        return DTYPE_NAMES[asked.lower()]
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "f32"
    return "bf16" if cpu_has_fast_bf16() else "f32"


def create(device: str | None = None, dtype: str | None = None) -> Any:
    """Make a :class:`tessera.backends.torch.ops.TorchBackend` (imports torch)."""
    try:
        from tessera.backends.torch.ops import TorchBackend
    except ImportError as exc:
        raise UnknownBackendError(
            f"the torch backend needs torch ({exc}); install it with `pip install torch`"
        ) from exc
    dev = pick_device(device)
    picked = pick_dtype(dtype, dev)
    asked = dtype is not None or text(TORCH_DTYPE) is not None
    # f32 asked for by name keeps the exact torch matmuls; f32 as a CPU's default (no fast
    # bf16 units) lets the native kernels round activations to int8 blocks, as llama.cpp does
    backend = TorchBackend(dev, picked, exact_f32=picked == "f32" and asked)
    backend.record_path("compute dtype", Choice(picked, _dtype_reason(picked, asked, dev)))
    return backend


def _dtype_reason(picked: str, asked: bool, device: Any) -> str:
    if asked:
        return "asked for" + (": the exact torch paths" if picked == "f32" else "")
    if device.type != "cpu":
        return "the GPU computes in bf16" if picked == "bf16" else "the GPU has no bf16"
    fast_bf16 = text(FAST_BF16)
    forced = f" ({FAST_BF16.name}={fast_bf16})" if fast_bf16 != "auto" else ""
    if picked == "bf16":
        return f"the CPU's fast bf16 units{forced}"
    return f"no fast bf16 units{forced}: f32 with the native kernels"


@hookimpl
def tessera_register_backends(register):
    register(
        BackendInfo(
            "torch",
            create,
            "torch on cpu/cuda; bf16 where fast; int4/int8 weight kernels; SDPA attention",
            priority=100,  # the fast backend: chosen over the numpy reference by default
        )
    )


def _run_llama_decoder(backend: Any, *inputs: Any) -> Any:
    from tessera.backends.torch.block import decoder_block

    return decoder_block(backend, *inputs)


def _serves_llama_decoder(backend: Any) -> bool:
    from tessera.backends.torch.block import choose_block

    return choose_block(backend).path == "one native call"


@hookimpl
def tessera_register_block_fusions(register):
    register(
        BlockFusion(
            "torch",
            LLAMA_DECODER,
            _run_llama_decoder,
            _serves_llama_decoder,
            "a llama-family layer per decode token in one native call (tsr_block_decode)",
        )
    )


@hookimpl
def tessera_register_switches(register):
    from tessera.backends.native.cpu_paths import NATIVE_PATH
    from tessera.backends.native.dense_gemv import (
        F16_IN_PLACE_DISABLE,
        NATIVE_CONVERT_DISABLE,
        NATIVE_DENSE_DISABLE,
    )
    from tessera.backends.native.library import NATIVE_AMX_DISABLE
    from tessera.backends.native.probe import NATIVE_DISABLE, NATIVE_QUANT_DISABLE
    from tessera.backends.native.vnni_gemm import NATIVE_VNNI_GEMM_DISABLE
    from tessera.backends.torch.block import DECODER_BLOCK_DISABLE
    from tessera.backends.torch.dense_native import F32_PREFILL

    switches = (
        TORCH_DTYPE, FAST_BF16, F32_ACTIVATIONS, F32_ATTENTION, PACKED_LINEAR, FUSED_NORM,
        INFERENCE_MODE, DECODER_BLOCK_DISABLE, CHUNKED_DELTA,
    )  # fmt: skip
    for switch in switches:
        register(switch)
    register(NATIVE_DISABLE)  # the native kernels serve this backend and its weight kernels
    register(NATIVE_AMX_DISABLE)
    register(NATIVE_VNNI_GEMM_DISABLE)
    register(NATIVE_QUANT_DISABLE)
    register(NATIVE_DENSE_DISABLE)
    register(NATIVE_CONVERT_DISABLE)
    register(F16_IN_PLACE_DISABLE)
    register(F32_PREFILL)
    register(NATIVE_PATH)

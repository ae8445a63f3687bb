"""The ``example`` backend: float32 numpy ops, with a deliberately partial op set.

What it shows a backend author:

- ``supports(op, **attrs)`` declines what the backend cannot do, from the op's real
  parameters: RoPE in GGML's normal mode (``neox=False``, used by GGUF ``llama`` files)
  and grouped-query attention (``n_head != n_head_kv``). tessera's loader asks before it
  loads a weight: with ``--backend example`` such a model is refused with the reason, and
  with no ``--backend`` the next installed backend runs it. The fallback is per model,
  not per op: a backend runs all of a model's ops or none.
- ``use_kernels`` / ``load_weight``: weights of a type with a registered kernel for this
  backend (``EX_I8``, registered below) stay int8; every other type is dequantized once.
- ``record`` notes each decision, so ``placements`` say which path every weight took.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from tessera import switches
from tessera.contract.backend import CORE_OPS, Backend, BackendInfo
from tessera.contract.ops import Op
from tessera.contract.quant import WeightKernel, kernel_matches_reference
from tessera.errors import UnknownBackendError
from tessera.hookspecs import hookimpl
from tessera_example_backend.quant import BLOCK_SIZE, EX_I8, split_blocks

TESSERA_PLUGIN_API = 2


class ExampleBackend(Backend):
    name = "example"
    device = "cpu"
    dtype = "f32"

    def __init__(self) -> None:
        super().__init__()
        self._kernels: dict[str, WeightKernel] = {}
        self.probe_cache: dict[str, bool] = {}

    def supports(self, op: Op) -> bool:
        if op.name == "rope" and op.get("neox") is False:
            return False
        if op.name == "attention" and op.get("n_head", 1) != op.get("n_head_kv", 1):
            return False
        return op.name in CORE_OPS

    def use_kernels(self, kernels: Mapping[tuple[str, str], WeightKernel]) -> None:
        self._kernels = {q: k for (b, q), k in kernels.items() if b == self.name}

    # -- arrays ----------------------------------------------------------------------

    def from_numpy(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return a.astype(np.float32) if a.dtype.kind == "f" else a.copy()

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    def load_weight(self, raw: Any, qtype: Any) -> Any:
        kernel = self._kernels.get(qtype.name) if len(raw.shape) == 2 else None
        off = {n.upper() for n in switches.names(switches.DISABLE_KERNELS)}
        switched_off = bool({"ALL", qtype.name.upper()} & off)
        if kernel is not None and not switched_off and kernel.supports(self):
            self.record(raw.name, f"kernel {qtype.name}", kernel.description)
            return kernel.load(self, raw)
        reason = "switched off" if kernel is not None and switched_off else "no kernel"
        self.record(raw.name, "dequantize", f"{qtype.name} decoded to f32 ({reason})")
        return qtype.dequantize_tensor(raw.data, raw.shape)

    # -- ops -------------------------------------------------------------------------

    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        if isinstance(w, Int8Weight):
            return w.matmul(x)
        return np.matmul(x, w.T)

    def get_rows(self, w: Any, ids: np.ndarray) -> np.ndarray:
        if isinstance(w, Int8Weight):
            return w.get_rows(ids)
        return np.take(w, np.asarray(ids), axis=0)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.multiply(a, b)

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return np.multiply(x, np.float32(s))

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        wide = x.astype(np.float64)
        y = (wide / np.sqrt(np.square(wide).mean(axis=-1, keepdims=True) + eps)).astype(np.float32)
        return y if weight is None else y * weight

    def layer_norm(self, x, weight, bias, eps):
        wide = x.astype(np.float64)
        centred = wide - wide.mean(axis=-1, keepdims=True)
        y = (centred / np.sqrt(np.square(centred).mean(axis=-1, keepdims=True) + eps)).astype(
            np.float32
        )
        y = y if weight is None else y * weight
        return y if bias is None else y + bias

    def rope(self, x, positions, n_rot, freq_base, neox, freq_scale=1.0):
        if not neox:
            raise UnknownBackendError("the example backend implements only NeoX-style RoPE")
        half = n_rot // 2
        theta = np.outer(
            np.asarray(positions, np.float64) * freq_scale,
            np.power(float(freq_base), -np.arange(0, n_rot, 2) / n_rot),
        )
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # (T, 1, n_rot/2)
        first, second, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
        rotated = [first * cos - second * sin, second * cos + first * sin]
        return np.concatenate([*(r.astype(np.float32) for r in rotated), rest], axis=-1)

    def silu(self, x: np.ndarray) -> np.ndarray:
        return x * (0.5 * (1.0 + np.tanh(0.5 * x)))  # sigmoid without overflow in exp

    def gelu(self, x: np.ndarray) -> np.ndarray:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * np.power(x, 3))
        return 0.5 * x * (1.0 + np.tanh(inner))

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return self.silu(gate) * up

    def attention(self, q, k_cache, v_cache, n_kv, mask, scale):
        if q.shape[1] != k_cache.shape[1]:
            raise UnknownBackendError("the example backend has no grouped-query attention")
        k, v = k_cache[:n_kv], v_cache[:n_kv]
        scores = np.einsum("qhd,khd->hqk", q, k) * np.float32(scale)
        scores = np.where(mask, scores, -np.inf)
        visible = mask.any(axis=1)  # (T,): rows with at least one cell to attend
        top = np.where(visible[None, :, None], scores.max(axis=-1, keepdims=True), 0.0)
        probs = np.where(mask, np.exp(scores - top), 0.0)
        probs /= np.maximum(probs.sum(axis=-1, keepdims=True), np.finfo(np.float32).tiny)
        out = np.einsum("hqk,khd->qhd", probs, v)
        return out.reshape(q.shape[0], -1).astype(np.float32)

    def set_rows(self, dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
        dst[np.asarray(rows)] = src


class Int8Weight:
    """An ``EX_I8`` weight kept as int8 codes ``(n_out, n_blocks, 32)`` and float32 scales."""

    def __init__(self, scales: np.ndarray, codes: np.ndarray) -> None:
        self.scales, self.codes = scales, codes
        self.shape = (codes.shape[0], codes.shape[1] * BLOCK_SIZE)

    def matmul(self, x: np.ndarray) -> np.ndarray:
        # Per block: (x_block . codes_block) * scale, summed over blocks.
        blocks = x.reshape(x.shape[0], -1, BLOCK_SIZE)
        partial = np.einsum("tbk,obk->tob", blocks, self.codes.astype(np.float32))
        return (partial * self.scales[None]).sum(axis=-1, dtype=np.float32)

    def get_rows(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        rows = self.codes[ids].astype(np.float32) * self.scales[ids][..., None]
        return rows.reshape(len(ids), -1)


def load_int8(backend: ExampleBackend, raw: Any) -> Int8Weight:
    data = np.asarray(raw.data, dtype=np.uint8).reshape(raw.shape[0], -1)
    return Int8Weight(*split_blocks(data))


def supports_int8(backend: Any) -> bool:
    """Probe: one small EX_I8 matmul against numpy's dequantize-then-matmul (cached)."""
    if getattr(backend, "name", "") != "example":
        return False
    if "EX_I8" not in backend.probe_cache:
        backend.probe_cache["EX_I8"] = kernel_matches_reference(backend, EX_I8, load_int8)
    return backend.probe_cache["EX_I8"]


def create(device: str | None = None, dtype: str | None = None) -> ExampleBackend:
    if device not in (None, "cpu") or dtype not in (None, "f32"):
        raise UnknownBackendError(
            f"the example backend runs only on the cpu in f32 (asked for device={device!r}, "
            f"dtype={dtype!r})"
        )
    return ExampleBackend()


@hookimpl
def tessera_register_backends(register):
    register(BackendInfo("example", create, "example plugin: numpy f32, NeoX RoPE and MHA only"))


@hookimpl
def tessera_register_weight_kernels(register):
    register(
        WeightKernel(
            backend="example",
            quant_type="EX_I8",
            supports=supports_int8,
            load=load_int8,
            description="int8 codes + float32 block scales, summed per block",
        )
    )

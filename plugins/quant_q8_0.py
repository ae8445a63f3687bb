"""Q8_0: blocks of 32 int8 codes with one float16 scale, bit-exact with GGUF.

Block layout (34 bytes): ``d`` (float16) then 32 signed bytes ``q``; value = ``q * d`` with
``d = max|x| / 127`` and ``q`` rounded half away from zero, as ggml's reference quantizer.

The torch kernel keeps the int8 codes and per-block scales on the device (8.5 bits per
weight instead of 16 for bf16) and dequantizes to the compute dtype inside each matmul.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.hookspecs import hookimpl
from tessera.quant import QuantType, WeightKernel, kernel_matches_reference

TESSERA_PLUGIN_API = 1

BLOCK_SIZE = 32
TYPE_SIZE = 2 + BLOCK_SIZE


def _round_half_away(v: np.ndarray) -> np.ndarray:
    # floor(|v|) plus one when the fraction is >= 0.5, computed only with exact float32
    # steps (trunc(|v| + 0.5) would round twice); infinities and NaNs propagate as ggml's.
    a = np.abs(v)
    whole = np.floor(a)
    return np.sign(v) * (whole + np.floor(2 * (a - whole)))


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = x.reshape(-1, BLOCK_SIZE)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        q = _round_half_away(blocks * inv).astype(np.int8)
    out = np.concatenate([d.astype("<f2").view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE * TYPE_SIZE)


def dequantize(b: np.ndarray) -> np.ndarray:
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(-1, TYPE_SIZE)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).reshape(*b.shape[:-1], b.shape[-1] // TYPE_SIZE * BLOCK_SIZE)


Q8_0 = QuantType(
    "Q8_0", int(GGMLQuantizationType.Q8_0), BLOCK_SIZE, TYPE_SIZE, quantize, dequantize
)


class TorchQ8_0Weight:
    """A Q8_0 weight on a torch backend: int8 codes ``(n_out, n_in)`` + per-block scales.

    Implements the torch backend's quantized-weight interface: ``shape``, ``matmul(x)``
    and ``get_rows(ids)``.
    """

    def __init__(self, codes: Any, scales: Any, dtype: Any) -> None:
        self.codes = codes  # int8 (n_out, n_blocks, 32)
        self.scales = scales  # compute dtype (n_out, n_blocks, 1)
        self.dtype = dtype
        n_out, n_blocks, _ = codes.shape
        self.shape = (n_out, n_blocks * BLOCK_SIZE)

    def _dense(self, codes: Any, scales: Any) -> Any:
        return (codes.to(self.dtype) * scales).flatten(-2)

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self._dense(self.codes, self.scales).to(x.dtype))

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        index = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.codes.device)
        return self._dense(self.codes[index], self.scales[index])


def load_torch(backend: Any, raw: Any) -> TorchQ8_0Weight:
    """Split GGUF Q8_0 bytes into device tensors of codes and scales."""
    import torch

    n_out = raw.shape[0]
    blocks = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(n_out, -1, TYPE_SIZE)
    d = blocks[..., :2].copy().view("<f2")  # (n_out, n_blocks, 1)
    q = blocks[..., 2:].copy().view(np.int8)
    device, dtype = backend.torch_device, backend.torch_dtype
    scales = torch.from_numpy(d).to(device=device, dtype=dtype)
    return TorchQ8_0Weight(torch.from_numpy(q).to(device), scales, dtype)


def supports_torch(backend: Any) -> bool:
    """Probe: run one tiny Q8_0 matmul on ``backend`` and compare it with numpy; cached."""
    if getattr(backend, "name", "") != "torch":
        return False
    cache = backend.probe_cache
    if "Q8_0" not in cache:
        cache["Q8_0"] = kernel_matches_reference(backend, Q8_0, load_torch)
    return cache["Q8_0"]


@hookimpl
def tessera_register_quant_types(register):
    register(Q8_0)


@hookimpl
def tessera_register_weight_kernels(register):
    register(
        WeightKernel(
            backend="torch",
            quant_type="Q8_0",
            supports=supports_torch,
            load=load_torch,
            description="int8 codes + block scales, dequantized per matmul",
        )
    )

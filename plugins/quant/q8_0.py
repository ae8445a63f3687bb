"""Q8_0: blocks of 32 int8 codes with one float16 scale, bit-exact with GGUF.

Block layout (34 bytes): ``d`` (float16) then 32 signed bytes ``q``; value = ``q * d`` with
``d = max|x| / 127`` and ``q`` rounded half away from zero, as ggml's reference quantizer.

The torch kernel keeps the int8 codes and per-block scales on the device (8.5 bits per
weight instead of 16 for bf16) and dequantizes to the compute dtype inside prefill
matmuls; decode matmuls (fewer rows than ``TESSERA_Q8_0_DENSE_ROWS``, default 8) run
torch's int4 kernel on the weight split exactly into two int4 halves, in bf16/f16 or on
CUDA. On a CPU whose native kernels pass their probe (:mod:`tessera.backends.native.kernels`)
matmuls of fewer than ``NATIVE_MAX_ROWS`` rows read the file's bytes with VNNI dot products
instead, and no int4 halves are made.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import (
    QuantType,
    WeightKernel,
    file_bytes_tensor,
    kernel_matches_reference,
)
from tessera.engine.kv_types import dequantize_q8_0, quantize_q8_0
from tessera.hookspecs import hookimpl
from tessera.switches import NUMBER, Choice, Switch, choose, number

TESSERA_PLUGIN_API = 2

BLOCK_SIZE = 32
TYPE_SIZE = 2 + BLOCK_SIZE
#: On the CPU, matmuls of this many rows or more dequantize instead of using the int4 pair
#: (two int4 calls: the crossover with one dequantized bf16 matmul comes early, ~8 rows).
DEFAULT_DENSE_MIN_ROWS = 8
DENSE_ROWS = Switch(
    "TESSERA_Q8_0_DENSE_ROWS",
    f"Q8_0 matmuls of this many rows or more (default {DEFAULT_DENSE_MIN_ROWS} on the CPU in "
    "bf16/f16) dequantize instead of the exact int4-pair kernel; 0: always dequantize",
    NUMBER,
    off_at=0.0,
)
#: Matmuls of fewer rows use the native VNNI kernel where its probe passes
#: (:mod:`tessera.backends.native.probe`; ``TESSERA_NATIVE_DISABLE=1`` turns it off);
#: native / torch CPU time on a 4864x896 weight: 0.15 at 8 rows, 0.6 at 32, 1.3 at 64.
NATIVE_MAX_ROWS = 32


# the KV cache's q8_0 codec is ggml's reference one, bit-exact with GGUF
quantize, dequantize = quantize_q8_0, dequantize_q8_0


Q8_0 = QuantType(
    "Q8_0", int(GGMLQuantizationType.Q8_0), BLOCK_SIZE, TYPE_SIZE, quantize, dequantize
)


class TorchQ8_0Weight:
    """A Q8_0 weight on a torch backend: int8 codes ``(n_out, n_in)`` + per-block scales.

    Implements the torch backend's quantized-weight interface: ``shape``, ``matmul(x)``
    and ``get_rows(ids)``. Matmuls dequantize to the compute dtype, except those of fewer
    than ``dense_min_rows`` rows when ``int4`` holds the weight as two int4 halves (see
    :func:`split_int4`): decode then reads about 1 byte per weight instead of the 2 of a
    dequantized bf16 copy (plus its writing) — torch has no int8 kernel with per-block
    scales, but its int4 kernel with group size 32 takes Q8_0's blocks exactly.
    """

    def __init__(
        self,
        codes: Any,
        scales: Any,
        dtype: Any,
        int4: Any = None,
        dense_min_rows: float = 0,
        native: Any = None,
    ) -> None:
        # int8 (n_out, n_blocks, 32): on the device, or with the int4 pair a CPU view of
        # the file's bytes (memory-mapped: no second copy in RAM) for prefill and get_rows
        self.codes = codes
        # compute dtype (n_out, n_blocks, 1) on the device; None with the native kernels,
        # which read the file's scales in place: made on first use (a 0.5B model's took
        # ~0.16 s of its start-up)
        self._scales = scales
        self.dtype = dtype
        self.int4 = int4  # (mm, (packed_hi, sz_hi), (packed_lo, sz_lo)) or None
        self.dense_min_rows = dense_min_rows
        # (NativeGemv, uint8 block bytes (n_out, row bytes)) when the native kernel is used
        self.native = native
        n_out, n_blocks, _ = codes.shape
        self.shape = (n_out, n_blocks * BLOCK_SIZE)

    @property
    def scales(self) -> Any:
        """Every block's scale in the compute dtype, ``(n_out, n_blocks, 1)``."""
        if self._scales is None:
            self._scales = _file_scales(self.native[1], self.dtype)
        return self._scales

    def _dense(self, codes: Any, scales: Any) -> Any:
        return (codes.to(device=scales.device, dtype=self.dtype) * scales).flatten(-2)

    def native_gemv(self, n_rows: int) -> tuple[str, Any] | None:
        """``("Q8_0", block bytes)`` when a matmul of ``n_rows`` rows runs the native kernel
        (the backend may then batch it with other weights), else None."""
        if self.native is None or n_rows >= NATIVE_MAX_ROWS:
            return None
        if self.native[0].tiles_serve(n_rows, self.shape[0], self.dtype):
            return None  # the AMX kernel takes these rows, one weight at a time
        return "Q8_0", self.native[1]

    def native_tiles(self, n_rows: int) -> tuple[str, Any] | None:
        """``("Q8_0", block bytes)`` when a matmul of ``n_rows`` rows runs on the AMX tiles
        (the backend may then fuse it with another weight), else None."""
        if self.native is None:
            return None
        if not self.native[0].tiles_serve(n_rows, self.shape[0], self.dtype):
            return None
        return "Q8_0", self.native[1]

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        if self.native is not None:
            y = self.native[0].matmul_tiles("Q8_0", self.native[1], x)  # AMX (bf16 tiles)
            if y is not None:
                return y
            if x.shape[0] < NATIVE_MAX_ROWS:
                return self.native[0].matmul("Q8_0", self.native[1], x)
        if self.int4 is not None and x.shape[0] < self.dense_min_rows:
            mm, (hi, sz_hi), (lo, sz_lo) = self.int4
            y = mm(x, hi, BLOCK_SIZE, sz_hi).add_(mm(x, lo, BLOCK_SIZE, sz_lo))
            return y if y.shape[-1] == self.shape[0] else y[:, : self.shape[0]]
        return F.linear(x, self._dense(self.codes, self.scales).to(x.dtype))

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        index = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        codes = self.codes[index.to(self.codes.device)]
        if self._scales is None:  # the rows' own scales, from the file's bytes
            return self._dense(codes, _file_scales(self.native[1][index], self.dtype))
        return self._dense(codes, self._scales[index.to(self._scales.device)])


def _file_scales(rows: Any, dtype: Any) -> Any:
    """The block scales of Q8_0 block bytes ``rows`` (uint8 ``(n, row bytes)``) in ``dtype``,
    ``(n, n_blocks, 1)``."""
    import torch

    blocks = rows.view(rows.shape[0], -1, TYPE_SIZE)
    return blocks[..., :2].contiguous().view(torch.float16).to(dtype)


def split_int4(q: np.ndarray, d: np.ndarray) -> tuple[tuple[np.ndarray, ...], ...]:
    """Q8_0 codes ``q`` (int8 ``(n_out, n_in)``) and scales ``d`` (float32 ``(n_out, n_blocks)``)
    as two int4 groupwise weights whose sum is the Q8_0 weight, exactly.

    With ``u = q + 128 = 16 h + l`` (``h``, ``l`` in 0..15), ``q d = (h - 8)(16 d) +
    (l - 8) d + 8 d``: torch's int4 form ``(code - 8) * scale + zero`` with ``(h, 16 d, 0)``
    and ``(l, d, 8 d)``. Returns ``((h, 16 d, 0), (l, d, 8 d))``; the factors are powers of
    two, so the scales round to the compute dtype exactly as ``d`` does.
    """
    u = (q.astype(np.int16) + 128).astype(np.uint8)
    zeros = np.zeros_like(d)
    return (u >> np.uint8(4), 16 * d, zeros), (u & np.uint8(15), d, 8 * d)


def choose_dense_rows(backend: Any) -> Choice:
    """The rows from which a matmul dequantizes instead of using the int4 pair (the
    Choice's path; 0: always): ``TESSERA_Q8_0_DENSE_ROWS``, else on the CPU only in
    bf16/f16 (torch's CPU int4 kernel is ~30x slower in float32, so float32 always
    dequantizes), and every matmul on the int4 pair elsewhere."""
    rows = number(DENSE_ROWS)
    if rows is not None:
        why = f"{DENSE_ROWS.name}={rows:g}"
    elif backend.torch_device.type != "cpu":
        rows, why = math.inf, f"not on the CPU ({backend.device})"
    elif backend.dtype == "f32":
        rows, why = 0.0, "float32 on the CPU: torch's int4 kernel is ~30x slower there"
    else:
        rows, why = float(DEFAULT_DENSE_MIN_ROWS), f"the CPU crossover in {backend.dtype}"
    return choose(DENSE_ROWS, (rows > 0, why), on=rows, off=0.0)


def load_torch(backend: Any, raw: Any, min_rows: float | None = None) -> TorchQ8_0Weight:
    """Split GGUF Q8_0 bytes into device tensors of codes and scales (and the int4 pair)."""
    import torch

    from tessera.backends.native.probe import probe as native_probe
    from tessera.plugins.quant.q4_0 import int4_ops, pack_int4

    n_out = raw.shape[0]
    blocks = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(n_out, -1, TYPE_SIZE)
    device, dtype = backend.torch_device, backend.torch_dtype
    rows = choose_dense_rows(backend) if min_rows is None else None  # (probes pass their own)
    min_rows = rows.path if rows is not None else min_rows
    native = native_probe(backend) if device.type == "cpu" else None
    in_file = file_bytes_tensor(blocks)  # (n_out, n_blocks, 34), the file's own bytes
    codes = in_file[..., 2:].view(torch.int8)
    if native is not None:  # decode reads the file's bytes in place; prefill dequantizes
        raw_rows = in_file.view(n_out, -1)
        return TorchQ8_0Weight(codes, None, dtype, None, min_rows, (native, raw_rows))
    d = blocks[..., :2].copy().view("<f2")  # (n_out, n_blocks, 1)
    scales = torch.from_numpy(d).to(device=device, dtype=dtype)
    if rows is not None:  # the int4 pair serves decode where it is made: say when
        backend.record_path("Q8_0 dense rows", rows)
    ops = int4_ops(device.type)
    if min_rows <= 0 or ops is None:
        q = blocks[..., 2:].copy().view(np.int8)
        return TorchQ8_0Weight(torch.from_numpy(q).to(device), scales, dtype, None, min_rows)
    halves = split_int4(blocks[..., 2:].view(np.int8).reshape(n_out, -1), d[..., 0].astype("f4"))
    int4 = (ops[1], *(pack_int4(c, s, z, device, dtype) for c, s, z in halves))
    return TorchQ8_0Weight(codes, scales, dtype, int4, min_rows)


def supports_torch(backend: Any) -> bool:
    """Probe: run one tiny Q8_0 matmul on ``backend`` and compare it with numpy; cached.

    The probe's matmul has 2 rows, so it checks the path decode takes (the int4 pair
    where that is used); the dequantizing path is plain torch."""
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
            description="int8 codes + block scales; decode: native VNNI or int4 pair",
        )
    )


@hookimpl
def tessera_register_switches(register):
    register(DENSE_ROWS)

"""Q4_0: blocks of 32 4-bit codes with one float16 scale, bit-exact with GGUF.

Block layout (18 bytes): ``d`` (float16) then 16 bytes whose low nibbles hold values 0..15
of the block and high nibbles values 16..31; value = ``(q - 8) * d``. The quantizer takes
``d = m / -8`` where ``m`` is the block's value of largest magnitude (sign kept), as ggml.

The torch kernel keeps weights 4-bit in torch's int4 groupwise layout (group size 32 = one
Q4_0 block) and multiplies with ``_weight_int4pack_mm``; torch is imported only when the
kernel is used. On a CPU whose native kernels pass their probe
(:mod:`tessera.backends.native.probe`), bf16 matmuls of ``AMX_MIN_ROWS`` rows or more run
on the AMX tile units where the CPU has them (each block dequantized into a tile), other
matmuls of fewer than ``NATIVE_MAX_ROWS`` rows read the weight's bytes with VNNI dot
products, and prefill's dequantization to the compute dtype runs there too (bit for bit the
torch path's values). There the bytes are rearranged at load into the 4-row layout of
:mod:`tessera.backends.native.q4_0_x4` (in place of the file's; ``TESSERA_NATIVE_Q4_0_REPACK=0``
keeps the file's), from which the other paths take the file's rows back per call.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from tessera.backends.native.q4_0_x4 import GROUP_ROWS, NATIVE_Q4_0_REPACK, layout_choice
from tessera.backends.native.q4_0_x4 import KIND as X4_KIND
from tessera.contract.quant import (
    QuantType,
    WeightKernel,
    file_bytes_tensor,
    kernel_matches_reference,
)
from tessera.hookspecs import hookimpl
from tessera.switches import NUMBER, Choice, Switch, choose, number

TESSERA_PLUGIN_API = 2

BLOCK_SIZE = 32
TYPE_SIZE = 2 + BLOCK_SIZE // 2
#: On the CPU, matmuls of this many rows or more dequantize to the compute dtype instead
#: of using the int4 kernel (``TESSERA_Q4_0_DENSE_ROWS`` overrides; ``inf`` disables).
#: Measured by CPU time on a 4864x896 weight in bf16 (AMX): int4 / dequantize+dense is
#: 0.74 at 64 rows and 1.37 at 128 (docs/performance.md).
DEFAULT_DENSE_MIN_ROWS = 96
DENSE_ROWS = Switch(
    "TESSERA_Q4_0_DENSE_ROWS",
    f"CPU Q4_0 matmuls of this many rows or more (default {DEFAULT_DENSE_MIN_ROWS}) dequantize "
    "and use the dense matmul instead of the int4 kernel; inf: never",
    NUMBER,
    off_at=math.inf,
)
#: Matmuls of fewer rows use the native VNNI kernel where its probe passes
#: (:mod:`tessera.backends.native.probe`; ``TESSERA_NATIVE_DISABLE=1`` turns it off);
#: native / int4 CPU time on a 4864x896 weight: 0.6 at 1 row, 0.5 at 32, 0.7 at 64.
NATIVE_MAX_ROWS = 64


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = x.reshape(-1, BLOCK_SIZE)
    pick = np.abs(blocks).argmax(axis=1)[:, None]
    d = np.take_along_axis(blocks, pick, axis=1) / np.float32(-8)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
        # trunc(v + 8.5) is round-half-up of v, shifted into 0..16; 16 only for v = +8.
        q = np.trunc(blocks * inv + np.float32(8.5)).astype(np.uint8).clip(0, 15)
    packed = q[:, : BLOCK_SIZE // 2] | (q[:, BLOCK_SIZE // 2 :] << np.uint8(4))
    out = np.concatenate([d.astype("<f2").view(np.uint8), packed], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE * TYPE_SIZE)


def unpack_codes(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales ``(n_blocks, 1)`` float32 and codes 0..15 ``(n_blocks, 32)`` uint8 of Q4_0 bytes."""
    blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, TYPE_SIZE)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    packed = blocks[:, 2:]
    return d, np.concatenate([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=1)


def dequantize(b: np.ndarray) -> np.ndarray:
    d, q = unpack_codes(b)
    values = (q.astype(np.int8) - np.int8(8)).astype(np.float32) * d
    return values.reshape(*b.shape[:-1], b.shape[-1] // TYPE_SIZE * BLOCK_SIZE)


Q4_0 = QuantType(
    "Q4_0", int(GGMLQuantizationType.Q4_0), BLOCK_SIZE, TYPE_SIZE, quantize, dequantize
)


class TorchQ4_0Weight:
    """A Q4_0 weight on a torch backend, kept 4-bit: torch's int4 groupwise packing.

    Implements the torch backend's quantized-weight interface: ``shape``, ``matmul(x)``
    and ``get_rows(ids)``. torch's kernel computes ``(code - 8) * scale + zero`` per group
    of 32 inputs, so a Q4_0 block maps onto it exactly with ``scale = d`` and ``zero = 0``.
    Output rows are padded to a multiple of 16 for the kernel and cut off again.

    ``raw`` (the GGUF bytes, usually a view of the memory-mapped file, so no extra copy in
    RAM; or, ``kind`` ``"Q4_0_x4"``, the same bytes in the native 4-row layout) serves
    :meth:`get_rows` and, on the CPU, matmuls of at least ``dense_min_rows`` rows: there a
    dequantized bf16 matmul on the AMX units beats the int4 kernel, while the int4 kernel
    wins for decode, where reading the weight is the cost.
    """

    def __init__(
        self,
        raw: Any,
        device: Any,
        n_out: int,
        mm: Any,
        dtype: Any,
        dense_min_rows: float,
        native: Any = None,
        kind: str = "Q4_0",
    ) -> None:
        self.raw = raw  # uint8 (n_out, row bytes) on the CPU, in the layout ``kind`` names
        self.kind = kind
        # torch's int4 layout, made when first needed (:meth:`int4`): with the native
        # kernel for decode and dense prefill, most weights never need it
        self.packed: Any = None
        self.scales_and_zeros: Any = None
        self.mm = mm
        self.dtype = dtype
        self.device = device
        self.dense_min_rows = dense_min_rows
        self.native = native  # NativeGemv reading ``raw`` in place, or None
        self.shape = (n_out, raw.shape[1] // TYPE_SIZE * BLOCK_SIZE)

    def int4(self) -> tuple[Any, Any]:
        """``(packed, scales_and_zeros)`` for torch's int4 kernel, packed on first use."""
        if self.packed is None:
            n_out, n_in = self.shape
            d, q = unpack_codes(self.file_rows().numpy())
            scales = d.reshape(n_out, -1)
            zeros = np.zeros_like(scales)
            packed = pack_int4(q.reshape(n_out, n_in), scales, zeros, self.device, self.dtype)
            self.packed, self.scales_and_zeros = packed
        return self.packed, self.scales_and_zeros

    def file_rows(self, ids: Any = None) -> Any:
        """Rows ``ids`` (an int64 tensor; None: every row) as the file's block bytes: views
        of ``raw``, or taken back from the 4-row layout (a copy)."""
        if self.kind == X4_KIND:
            return self.native.unpack_q4_0_x4(self.raw, ids)
        return self.raw if ids is None else self.raw[ids]

    def _dequantize(self, rows: Any) -> Any:
        import torch

        if self.native is not None:  # the same values in one C pass (pp512 ~2x, docs)
            return self.native.dequantize("Q4_0", rows, self.dtype)
        blocks = rows.view(rows.shape[0], -1, TYPE_SIZE)
        d = blocks[..., :2].contiguous().view(torch.float16).float()
        packed = blocks[..., 2:]
        # Nibbles written straight into one byte buffer (no concatenation, which is slow on
        # the CPU), then one conversion to float32: ~1.8x faster than converting each half
        # into a float32 buffer. (q - 8) * d is exact in float32, so the only rounding is
        # the final one to the compute dtype, as in the dequantize fallback.
        codes = torch.empty(*packed.shape[:-1], BLOCK_SIZE, dtype=torch.uint8)
        torch.bitwise_and(packed, 0x0F, out=codes[..., : BLOCK_SIZE // 2])
        torch.bitwise_right_shift(packed, 4, out=codes[..., BLOCK_SIZE // 2 :])
        values = codes.to(torch.float32).sub_(8.0).mul_(d).flatten(1)
        return values.to(device=self.device, dtype=self.dtype)

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        if self.native is not None:
            tiles = self.native_tiles(x.shape[0])
            if tiles is not None:  # AMX: blocks into bf16 tiles
                y = self.native.matmul_tiles(*tiles, x)
                if y is not None:
                    return y
            if x.shape[0] < NATIVE_MAX_ROWS:
                return self.native.matmul(self.kind, self.raw, x)
        if x.shape[0] >= self.dense_min_rows:
            return F.linear(x, self._dequantize(self.file_rows()).to(x.dtype))
        packed, scales_and_zeros = self.int4()
        y = self.mm(x, packed, BLOCK_SIZE, scales_and_zeros)
        return y if y.shape[-1] == self.shape[0] else y[:, : self.shape[0]]

    def native_gemv(self, n_rows: int) -> tuple[str, Any] | None:
        """``(kind, block bytes)`` when a matmul of ``n_rows`` rows runs the native kernel
        (the backend may then batch it with other weights of that kind), else None."""
        if self.native is None or n_rows >= NATIVE_MAX_ROWS:
            return None
        if self.native.prefill_serves(n_rows, self.shape[0], self.dtype):
            return None  # the prefill GEMM (AMX or VNNI) takes these rows, one weight at a time
        return self.kind, self.raw

    def native_tiles(self, n_rows: int) -> tuple[str, Any] | None:
        """``("Q4_0", the file's block bytes)`` when a matmul of ``n_rows`` rows runs on the AMX
        tiles (the backend may then fuse it with another weight), else None."""
        if self.native is None or not self.native.prefill_serves(n_rows, self.shape[0], self.dtype):
            return None
        return "Q4_0", self.file_rows()

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        return self._dequantize(self.file_rows(torch.from_numpy(np.asarray(ids, dtype=np.int64))))


def int4_ops(device_type: str) -> tuple[Any, Any] | None:
    """torch's (pack, matmul) int4 ops for a device type, or None where torch has none."""
    import torch

    aten = torch.ops.aten
    names = {
        "cpu": ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
        "cuda": ("_convert_weight_to_int4pack", "_weight_int4pack_mm"),
    }.get(device_type)
    if names is None or not all(hasattr(aten, n) for n in names):
        return None
    return getattr(aten, names[0]), getattr(aten, names[1])


def choose_dense_rows(device_type: str) -> Choice:
    """The rows from which a Q4_0 matmul dequantizes instead (the Choice's path; ``inf``:
    never): on the CPU only, ``TESSERA_Q4_0_DENSE_ROWS`` or the default."""
    rows = number(DENSE_ROWS)
    rows = float(DEFAULT_DENSE_MIN_ROWS) if rows is None else rows
    if device_type != "cpu":
        probe = (False, f"not on the CPU ({device_type}): the int4 kernel for every size")
    else:
        probe = (True, f"from {rows:g} rows on the dense matmul, fewer on the int4 kernel")
    return choose(DENSE_ROWS, probe, on=rows, off=math.inf)


def load_torch(backend: Any, raw: Any, min_rows: float | None = None) -> TorchQ4_0Weight:
    """A Q4_0 weight over the GGUF bytes; packed into torch's int4 layout on the backend's
    device at load only when no native kernel serves decode (else on first int4 use)."""

    from tessera.backends.native.probe import probe as native_probe

    device, dtype = backend.torch_device, backend.torch_dtype
    mm = int4_ops(device.type)[1]
    n_out = raw.shape[0]
    rows = np.ascontiguousarray(raw.data, dtype=np.uint8).reshape(n_out, -1)
    if min_rows is None:  # (the probe passes its own)
        min_rows = backend.record_path("Q4_0 dense rows", choose_dense_rows(device.type)).path
    native = native_probe(backend) if device.type == "cpu" else None
    kind, raw_bytes = "Q4_0", file_bytes_tensor(rows)
    if native is not None and n_out % GROUP_ROWS == 0:
        layout = backend.record_path("Q4_0 layout", layout_choice(native))
        if layout.path == X4_KIND:  # the copy replaces the file's bytes: the same size
            kind, raw_bytes = X4_KIND, native.repack_q4_0_x4(raw_bytes)
    weight = TorchQ4_0Weight(raw_bytes, device, n_out, mm, dtype, min_rows, native, kind)
    if native is None:
        weight.int4()  # the int4 kernel serves decode: pack while loading
    return weight


def pack_int4(
    codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, device: Any, dtype: Any
) -> tuple[Any, Any]:
    """torch's int4 groupwise layout (group 32) of codes 0..15 ``(n_out, n_in)`` with
    per-group ``scales`` and ``zeros`` ``(n_out, n_in / 32)``: the kernel computes
    ``(code - 8) * scale + zero``. Returns ``(packed, scales_and_zeros)``; output rows are
    padded to a multiple of 16 (code 8, scale 0: rows of zeros)."""
    import torch

    pack = int4_ops(device.type)[0]
    n_out, n_in = codes.shape
    n_pad = -n_out % 16  # the kernels take output rows in multiples of 16
    codes = np.pad(codes, ((0, n_pad), (0, 0)), constant_values=8)
    scales, zeros = (np.pad(a, ((0, n_pad), (0, 0))) for a in (scales, zeros))
    if device.type == "cpu":
        packed = pack(torch.from_numpy(codes.astype(np.int32)), 2)
    else:  # CUDA takes two codes per byte, high nibble first, and a K-tiling factor
        pairs = torch.from_numpy((codes[:, ::2] << 4) | codes[:, 1::2]).to(device)
        packed = pack(pairs, next(t for t in (8, 4, 2) if n_in % (16 * t) == 0))
    sz = torch.from_numpy(np.stack([scales.T, zeros.T], axis=-1)).to(device=device, dtype=dtype)
    return packed, sz.contiguous()


def supports_torch(backend: Any) -> bool:
    """Probe: run the int4 kernel once on a tiny weight and compare it with numpy; cached."""
    if getattr(backend, "name", "") != "torch":
        return False
    cache = backend.probe_cache
    if "Q4_0" not in cache:
        cache["Q4_0"] = int4_ops(backend.torch_device.type) is not None and (
            kernel_matches_reference(backend, Q4_0, partial(load_torch, min_rows=math.inf))
        )
    return cache["Q4_0"]


@hookimpl
def tessera_register_quant_types(register):
    register(Q4_0)


@hookimpl
def tessera_register_weight_kernels(register):
    register(
        WeightKernel(
            backend="torch",
            quant_type="Q4_0",
            supports=supports_torch,
            load=load_torch,
            description="torch int4 kernel (4-bit in memory); decode: native VNNI if probed",
        )
    )


@hookimpl
def tessera_register_switches(register):
    register(DENSE_ROWS)
    register(NATIVE_Q4_0_REPACK)

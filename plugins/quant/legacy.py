"""Q4_1, Q5_0, Q5_1: llama.cpp's legacy blocks of 32 values, bit-exact with ggml.

Block layouts. In every type the 16 bytes ``qs`` hold the low 4 bits of the codes: value
``j`` of the block in the low nibble of ``qs[j]``, value ``j + 16`` in the high nibble.

- Q4_1 (20 bytes): ``d``, ``m`` (float16), ``qs``; value = ``d * q + m``, q 0..15.
- Q5_0 (22 bytes): ``d``, ``qh``, ``qs``; value = ``d * (q - 16)``, q 0..31.
- Q5_1 (24 bytes): ``d``, ``m``, ``qh``, ``qs``; value = ``d * q + m``, q 0..31.

``qh`` (4 bytes) is a little-endian uint32 whose bit ``j`` is the fifth bit of value ``j``.

The quantizers are ggml's reference ones (``quantize_row_q4_1_ref`` ...; gguf.quants has
the same): Q4_1 and Q5_1 take ``m`` = the block's minimum and ``d = (max - min) / (2**bits
- 1)``; Q5_0 takes the value ``v`` of largest magnitude (the first one, sign kept) and ``d =
v / -16``. Codes are ``trunc((x - m) * (1 / d) + 0.5)``, for Q5_0 ``trunc(x * (1 / d) +
16.5)``, capped at the largest code; ``1 / d`` is 0 when ``d`` is.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import (
    int4_kernel,
    int4_or_grouped,
    torch_grouped_kernel,
    torch_grouped_weight,
)
from tessera.plugins.quant.native_weight import with_native
from tessera.switches import NUMBER, Switch

TESSERA_PLUGIN_API = 2

F32 = np.float32
BLOCK_SIZE = 32
HALF = BLOCK_SIZE // 2
INT4_ROWS = Switch(
    "TESSERA_Q4_1_INT4_ROWS",
    "Q4_1 matmuls of fewer rows (default 16, CPU bf16/f16) on torch's int4 kernel, larger "
    "ones on a dense copy; 0: only the dense copy",
    NUMBER,
    off_at=0.0,
)


def _fp16(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return values.astype("<f2").view(np.uint8)


def _read_fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view("<f2").astype(F32)


@attrs.frozen
class LegacyFormat:
    """One legacy block type: ``bits`` per code, with a stored minimum (``has_min``) or
    symmetric around zero (Q5_0)."""

    name: str
    bits: int
    has_min: bool

    @property
    def top(self) -> int:
        return (1 << self.bits) - 1

    @property
    def type_size(self) -> int:
        return 2 + 2 * self.has_min + 4 * (self.bits == 5) + HALF

    def codes(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``d`` and ``m`` ``(n, 1)`` float32 (``m`` None for Q5_0) and codes ``(n, 32)``."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.has_min:
                lo = blocks.min(axis=1, keepdims=True)
                d = (blocks.max(axis=1, keepdims=True) - lo) / F32(self.top)
                inv = np.where(d == 0, F32(0), F32(1) / d)
                scaled = (blocks - lo) * inv + F32(0.5)
            else:
                lo = None
                pick = np.abs(blocks).argmax(axis=1)[:, None]
                d = np.take_along_axis(blocks, pick, axis=1) / F32(-16)
                inv = np.where(d == 0, F32(0), F32(1) / d)
                scaled = blocks * inv + F32(16.5)
            # C converts the float to an integer (truncation), then caps it at the top code
            codes = np.minimum(np.trunc(scaled).astype(np.uint8), self.top)
        return d, lo, codes

    def quantize(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=F32)
        d, lo, codes = self.codes(x.reshape(-1, BLOCK_SIZE))
        parts = [_fp16(d)]
        if lo is not None:
            parts.append(_fp16(lo))
        if self.bits == 5:
            parts.append(np.packbits(codes >> 4, axis=1, bitorder="little"))
        parts.append(codes[:, :HALF] & 15 | (codes[:, HALF:] & 15) << 4)
        out = np.concatenate(parts, axis=1)
        return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE * self.type_size)

    def unpack(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``d``, ``m`` (None for Q5_0) ``(n, 1)`` float32 and codes ``(n, 32)`` uint8 of
        stored blocks."""
        blocks = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, self.type_size)
        d = _read_fp16(blocks, 0)
        lo = _read_fp16(blocks, 2) if self.has_min else None
        qs = blocks[:, -HALF:]
        codes = np.concatenate([qs & 15, qs >> 4], axis=1)
        if self.bits == 5:
            qh = blocks[:, -HALF - 4 : -HALF]
            codes |= np.unpackbits(qh, axis=1, bitorder="little") << 4
        return d, lo, codes

    def dequantize(self, b: np.ndarray) -> np.ndarray:
        d, lo, codes = self.unpack(b)
        with np.errstate(invalid="ignore"):  # a stored scale may be infinite or NaN
            if lo is None:
                values = d * (codes.astype(np.int8) - np.int8(16)).astype(F32)
            else:
                values = d * codes.astype(F32) + lo  # (d * q) + m: gguf's order, for NaNs too
        return values.reshape(*b.shape[:-1], b.shape[-1] // self.type_size * BLOCK_SIZE)

    def load_torch(self, backend: Any, raw: Any, min_rows: float | None = None) -> Any:
        """Codes as uint8 (Q5_0: int8 ``q - 16``) plus a scale ``d`` and an offset ``-m``
        per block (:class:`~tessera.plugins.quant.kquant_common.TorchGroupedWeight`); Q4_1
        on the CPU in bf16/f16 on torch's int4 kernel for decode instead
        (:func:`~tessera.plugins.quant.kquant_common.int4_or_grouped`)."""
        n_out = raw.shape[0]
        d, lo, codes = self.unpack(np.asarray(raw.data).reshape(n_out, -1))
        codes, d = codes.reshape(n_out, -1, BLOCK_SIZE), d.reshape(n_out, -1, 1)
        if lo is None:
            signed = (codes.astype(np.int16) - 16).astype(np.int8)
            return torch_grouped_weight(backend, signed, d, None)
        if self.bits == 4:
            scale, offset = d.reshape(n_out, -1), -lo.reshape(n_out, -1)
            return int4_or_grouped(backend, self.name, INT4_ROWS, codes, scale, offset, min_rows)
        return torch_grouped_weight(backend, codes, d, -lo.reshape(d.shape))

    def quant_type(self) -> QuantType:
        ggml_type = int(GGMLQuantizationType[self.name])
        return QuantType(
            self.name, ggml_type, BLOCK_SIZE, self.type_size, self.quantize, self.dequantize
        )


Q4_1 = LegacyFormat("Q4_1", bits=4, has_min=True)
Q5_0 = LegacyFormat("Q5_0", bits=5, has_min=False)
Q5_1 = LegacyFormat("Q5_1", bits=5, has_min=True)
FORMATS = (Q4_1, Q5_0, Q5_1)
QUANT_TYPES = {f.name: f.quant_type() for f in FORMATS}


@hookimpl
def tessera_register_quant_types(register):
    for qtype in QUANT_TYPES.values():
        register(qtype)


@hookimpl
def tessera_register_weight_kernels(register):
    q4_1 = QUANT_TYPES["Q4_1"]
    int4 = int4_kernel(
        q4_1,
        Q4_1.load_torch,
        INT4_ROWS,
        "uint8 codes + scale/min per 32; CPU: int4 decode + dense prefill",
    )
    register(with_native(q4_1, int4))
    for fmt, what in ((Q5_0, "int8 codes + scale"), (Q5_1, "uint8 codes + scale/min")):
        qtype = QUANT_TYPES[fmt.name]
        grouped = torch_grouped_kernel(
            qtype, fmt.load_torch, f"{what} per 32, dequantized per matmul"
        )
        register(with_native(qtype, grouped))


@hookimpl
def tessera_register_switches(register):
    register(INT4_ROWS)

"""The grid types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: read, bit-exact with
gguf.quants; tessera does not write them.

Each super-block of 256 values holds one float16 ``d`` and per group of 32 a small scale;
values come in runs of 8 (IQ1, IQ2) or 4 (IQ3) read from a fixed grid of points (a
lattice of magnitudes: 8, 25, 43 for IQ2; 4 ... 62 or 1 ... 15 for IQ3; -1, 0, 1 for IQ1),
with signs stored apart (IQ2, IQ3). The grids and ``ksigns`` (a 7-bit sign pattern plus
the parity bit that makes the eighth) are the format's tables: they are taken at import
from ``gguf.quants`` (its ``grid_hex`` / ``grid_map`` / ``ksigns`` attributes), not
copied here. Layouts (bytes; ``g`` is a group of 32):

- IQ2_XXS (66): ``d``; per ``g`` 8 bytes: 4 grid indices, then a uint32 of four 7-bit
  sign indices and a 4-bit scale ``s`` (top); group scale ``d * (0.5 + s) / 4``.
- IQ2_XS (74): ``d``; 32 uint16 (9-bit grid index, 7-bit sign index); 8 bytes of two 4-bit
  scales per ``g`` (first 16 values low nibble); scale as IQ2_XXS.
- IQ2_S (82): ``d``; 32 grid index bytes, 32 sign bytes, 8 bytes of 2 high index bits per
  run, 8 scale bytes as IQ2_XS.
- IQ3_XXS (98): ``d``; 64 grid index bytes (runs of 4); per ``g`` a uint32 as IQ2_XXS;
  group scale ``d * (0.5 + s) / 2``.
- IQ3_S (110): ``d``; 64 grid index bytes, 8 bytes of their 9th bits, 32 sign bytes, 4
  bytes of 4-bit scales; group scale ``d * (1 + 2 s)``.
- IQ1_S (50): ``d``; 32 grid index bytes; per ``g`` a uint16: 3 high index bits per run,
  a 3-bit scale ``s`` (bits 12-14) and the sign of ``delta`` (bit 15);
  value = ``d * (2 s + 1) * (grid + delta)``, ``delta = ±1/8``.
- IQ1_M (56): 32 grid index bytes; 16 bytes: per run of 8, 3 high index bits and the
  sign of ``delta`` in a nibble; 8 bytes of four uint16 holding two 3-bit scales per ``g``
  (one per 16 values) and, in their top nibbles, the float16 ``d``.

llama.cpp makes these types from an importance matrix (IQ1_S, IQ2_XXS and IQ2_XS cannot
be made without one), which tessera does not compute, so their ``quantize`` raises
:class:`~tessera.errors.TesseraError` and the types are ``read_only``.

On the torch backend the weights stay as the file's block bytes where the native kernels
serve them (:func:`~tessera.plugins.quant.native_weight.with_native`: int8 dot products for
decode, native dequantization for prefill); elsewhere they are dequantized at load.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil, log2

import gguf.quants
import numpy as np
from gguf import GGMLQuantizationType

from tessera.contract.quant import QuantType
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl
from tessera.plugins.quant.kquant_common import F32, QK_K
from tessera.plugins.quant.native_weight import with_native

TESSERA_PLUGIN_API = 2

#: What tessera writes instead, named in the refusal.
WRITABLE_INSTEAD = "IQ4_XS, IQ4_NL, Q4_K or Q4_0"
IQ1S_DELTA = F32(0.125)


def grid_from_gguf(name: str) -> np.ndarray:
    """The grid of ``gguf.quants.<name>`` as float32 ``(points, run)``.

    gguf keeps each grid as hex text of packed level numbers: ``ceil(log2(levels))`` bits
    each, packed from the low bits of every byte, then mapped through ``grid_map``.
    """
    spec = getattr(gguf.quants, name)
    packed = np.frombuffer(bytes.fromhex(spec.grid_hex.decode()), dtype=np.uint8)
    levels = np.asarray(spec.grid_map, dtype=F32)
    bits = ceil(log2(len(levels)))
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * (8 // per_byte)
    codes = (packed[:, None] >> shifts) & ((1 << bits) - 1)
    return levels[codes].reshape(spec.grid_shape)


GRIDS = {
    name: grid_from_gguf(name)
    for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S")
}
KSIGNS = np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)


def _sign_bits(signs: np.ndarray) -> np.ndarray:
    """Sign bytes ``(...)`` to factors ``(..., 8)``: bit ``j`` set gives -1 for value ``j``."""
    bits = (signs[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits == 0, F32(1), F32(-1))


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(F32)


def _blocks(b: np.ndarray, size: int) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, size)


def _signed_runs(db: np.ndarray, grid: np.ndarray, signs: np.ndarray) -> np.ndarray:
    """``db * grid * sign`` in gguf's order; ``db`` ``(n, groups)``, the others
    ``(n, groups, runs, run)``."""
    return db[..., None, None] * grid * signs


def _packed_signs(words: np.ndarray) -> np.ndarray:
    """Four 7-bit ``ksigns`` indices of each uint32 ``(n, g)`` as factors ``(n, g, 4, 8)``."""
    index = (words[..., None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 127
    return _sign_bits(KSIGNS[index])


def _nibble_scales(d: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """IQ2_XS / IQ2_S: one 4-bit scale per 16 values, ``d * (0.5 + s) / 4``, ``(n, 16)``."""
    s = np.stack([scales & 15, scales >> 4], axis=-1).reshape(len(d), -1)
    return d * (F32(0.5) + s.astype(F32)) * F32(0.25)


def dequantize_iq2_xxs(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 66)
    d = _f16(blocks[:, :2])
    words = blocks[:, 2:].copy().view("<u4").reshape(-1, 8, 2)
    db = d * (F32(0.5) + (words[..., 1] >> 28).astype(F32)) * F32(0.25)
    grid = GRIDS["IQ2_XXS"][blocks[:, 2:].reshape(-1, 8, 8)[..., :4]]
    return _signed_runs(db, grid, _packed_signs(words[..., 1]))


def dequantize_iq2_xs(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 74)
    d = _f16(blocks[:, :2])
    qs = blocks[:, 2:66].copy().view("<u2").reshape(-1, 16, 2)  # two runs per 16 values
    db = _nibble_scales(d, blocks[:, 66:])
    grid = GRIDS["IQ2_XS"][qs & 511]
    return _signed_runs(db, grid, _sign_bits(KSIGNS[qs >> 9]))


def dequantize_iq2_s(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 82)
    d = _f16(blocks[:, :2])
    high = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3
    index = blocks[:, 2:34].astype(np.uint16) | high.reshape(-1, 32).astype(np.uint16) << 8
    db = _nibble_scales(d, blocks[:, 74:82])
    grid = GRIDS["IQ2_S"][index.reshape(-1, 16, 2)]
    signs = _sign_bits(blocks[:, 34:66].reshape(-1, 16, 2))
    return _signed_runs(db, grid, signs)


def dequantize_iq3_xxs(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 98)
    d = _f16(blocks[:, :2])
    words = blocks[:, 66:].copy().view("<u4")
    db = d * (F32(0.5) + (words >> 28).astype(F32)) * F32(0.5)
    grid = GRIDS["IQ3_XXS"][blocks[:, 2:66].reshape(-1, 8, 4, 2)].reshape(-1, 8, 4, 8)
    return _signed_runs(db, grid, _packed_signs(words))


def dequantize_iq3_s(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 110)
    d = _f16(blocks[:, :2])
    high = (blocks[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1
    index = blocks[:, 2:66].astype(np.uint16) | high.reshape(-1, 64).astype(np.uint16) << 8
    scales = blocks[:, 106:110]
    s = np.stack([scales & 15, scales >> 4], axis=-1).reshape(-1, 8)
    db = d * (1 + 2 * s)  # uint8 (at most 31) times float32, as gguf
    grid = GRIDS["IQ3_S"][index.reshape(-1, 8, 4, 2)].reshape(-1, 8, 4, 8)
    signs = _sign_bits(blocks[:, 74:106].reshape(-1, 8, 4))
    return _signed_runs(db, grid, signs)


def _grid_plus_delta(dl: np.ndarray, index: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """IQ1: ``dl * (grid + delta)``; ``dl``, ``index``, ``negative`` broadcast per run."""
    delta = np.where(negative, -IQ1S_DELTA, IQ1S_DELTA)
    return dl[..., None] * (GRIDS["IQ1_S"][index] + delta[..., None])


def dequantize_iq1_s(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 50)
    d = _f16(blocks[:, :2])
    qh = blocks[:, 34:50].copy().view("<u2")  # (n, 8)
    dl = d * (2 * ((qh >> 12) & 7) + 1)
    high = (qh[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
    index = blocks[:, 2:34].reshape(-1, 8, 4).astype(np.uint16) | high << 8
    negative = (qh & 0x8000) != 0
    return _grid_plus_delta(dl[..., None], index, negative[..., None])


def dequantize_iq1_m(b: np.ndarray) -> np.ndarray:
    blocks = _blocks(b, 56)
    sc = blocks[:, 48:56].copy().view("<u2")  # (n, 4)
    top = (sc & 0xF000) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = _f16(np.bitwise_or.reduce(top, axis=1).astype("<u2"))[:, None]
    s = (sc[..., None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7
    dl = (d * (2 * s.reshape(-1, 16) + 1)).reshape(-1, 8, 2, 1)  # per 16 values
    qh = blocks[:, 32:48].reshape(-1, 8, 2, 1) >> np.array([0, 4], dtype=np.uint8)
    index = blocks[:, :32].reshape(-1, 8, 2, 2).astype(np.uint16) | (qh & 7).astype(np.uint16) << 8
    return _grid_plus_delta(dl, index, (qh & 8) != 0)


def _refuse(name: str) -> Callable[[np.ndarray], np.ndarray]:
    def quantize(x: np.ndarray) -> np.ndarray:
        raise TesseraError(
            f"tessera reads {name} but does not write it: llama.cpp makes the IQ1/IQ2/IQ3 "
            "types from an importance matrix, which tessera does not compute — quantize to "
            f"{WRITABLE_INSTEAD} instead, or make the file with llama-quantize --imatrix"
        )

    return quantize


def _flat(dequantize: Callable[[np.ndarray], np.ndarray], size: int) -> Callable:
    """``dequantize`` of whole blocks, reshaped to ``(..., values)`` as QuantType wants."""

    def decode(b: np.ndarray) -> np.ndarray:
        b = np.asarray(b, dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            values = dequantize(b)
        return values.reshape(*b.shape[:-1], b.shape[-1] // size * QK_K).astype(F32, copy=False)

    return decode


def _grid_type(name: str, dequantize: Callable[[np.ndarray], np.ndarray]) -> QuantType:
    qtype = GGMLQuantizationType[name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    assert block_size == QK_K
    return QuantType(
        name,
        int(qtype),
        block_size,
        type_size,
        _refuse(name),
        _flat(dequantize, type_size),
        read_only=True,
    )


GRID_TYPES = [
    _grid_type("IQ1_S", dequantize_iq1_s),
    _grid_type("IQ1_M", dequantize_iq1_m),
    _grid_type("IQ2_XXS", dequantize_iq2_xxs),
    _grid_type("IQ2_XS", dequantize_iq2_xs),
    _grid_type("IQ2_S", dequantize_iq2_s),
    _grid_type("IQ3_XXS", dequantize_iq3_xxs),
    _grid_type("IQ3_S", dequantize_iq3_s),
]


@hookimpl
def tessera_register_quant_types(register):
    for qtype in GRID_TYPES:
        register(qtype)


@hookimpl
def tessera_register_weight_kernels(register):
    for qtype in GRID_TYPES:
        register(with_native(qtype, None))

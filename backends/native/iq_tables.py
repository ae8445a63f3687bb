"""The grid types' tables as a C header generated at build time (``native_iq_tables.h``,
included by ``native_iq.h``): the grids of IQ1_S/IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and
IQ3_S and the ``ksigns`` table, taken from ``gguf.quants`` (its ``grid_hex`` / ``grid_map``
/ ``ksigns`` attributes), never typed in by hand.

Each grid point becomes its signed bytes packed little-endian into one integer (uint64 for
runs of 8, uint32 for IQ3's runs of 4); IQ1's points are stored times 8 so that a point plus
its ``delta = ±1/8`` is the integer ``8 grid ± 1``. ``TSR_KSIGNS`` is gguf's ``ksigns``.
"""

from __future__ import annotations

from functools import cache
from math import ceil, log2
from pathlib import Path

import numpy as np

#: The generated header's file name (``#include``-d by ``native_iq.h``).
HEADER_NAME = "native_iq_tables.h"
#: (C name, gguf.quants attribute, factor on the levels) of each grid table.
GRIDS = (
    ("TSR_IQ2XXS_GRID", "IQ2_XXS", 1),
    ("TSR_IQ2XS_GRID", "IQ2_XS", 1),
    ("TSR_IQ2S_GRID", "IQ2_S", 1),
    ("TSR_IQ3XXS_GRID", "IQ3_XXS", 1),
    ("TSR_IQ3S_GRID", "IQ3_S", 1),
    ("TSR_IQ1_GRID8", "IQ1_S", 8),
)


def grid_levels(name: str) -> np.ndarray:
    """``gguf.quants.<name>``'s grid as integers ``(points, run)``: its ``grid_hex`` holds
    level numbers of ``ceil(log2(levels))`` bits packed from the low bits of each byte
    (as many as fit in whole halves of it), mapped through ``grid_map``."""
    import gguf.quants

    spec = getattr(gguf.quants, name)
    packed = np.frombuffer(bytes.fromhex(spec.grid_hex.decode()), dtype=np.uint8)
    levels = np.asarray(spec.grid_map, dtype=np.int64)
    bits = ceil(log2(len(levels)))
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * (8 // per_byte)
    codes = (packed[:, None] >> shifts) & ((1 << bits) - 1)
    return levels[codes].reshape(spec.grid_shape)


def ksigns() -> np.ndarray:
    """``gguf.quants``' 128 ``ksigns`` bytes: 7 sign bits and the parity bit."""
    import gguf.quants

    return np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8)


def _packed(points: np.ndarray) -> list[int]:
    """Each row of signed bytes as one little-endian unsigned integer."""
    raw = np.ascontiguousarray(points.astype(np.int8)).view(np.uint8)
    return [int.from_bytes(row.tobytes(), "little") for row in raw]


def _table(c_type: str, name: str, values: list[int], digits: int) -> str:
    body = ",".join(f"0x{v:0{digits}x}" for v in values)
    return f"static const {c_type} {name}[{len(values)}] = {{{body}}};\n"


@cache
def header_text() -> str:
    """The header's text (deterministic: part of the library's cache key)."""
    out = ["/* Generated from gguf.quants by backends/native/iq_tables.py; do not edit. */\n"]
    out.append("#ifndef TSR_NATIVE_IQ_TABLES_H\n#define TSR_NATIVE_IQ_TABLES_H\n")
    out.append("#include <stdint.h>\n")
    for c_name, gguf_name, factor in GRIDS:
        points = grid_levels(gguf_name) * factor
        c_type, digits = ("uint64_t", 16) if points.shape[1] == 8 else ("uint32_t", 8)
        out.append(_table(c_type, c_name, _packed(points), digits))
    out.append(_table("uint8_t", "TSR_KSIGNS", [int(v) for v in ksigns()], 2))
    out.append("#endif\n")
    return "".join(out)


def write_header(directory: Path) -> Path:
    """Write the header into ``directory`` (a compiler ``-I`` folder); its path."""
    path = Path(directory) / HEADER_NAME
    path.write_text(header_text())
    return path

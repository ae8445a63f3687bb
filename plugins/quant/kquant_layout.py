"""Bit layouts that several K-quant types share (not an entry point; q2_k ... q5_k use it).

- The 12 bytes of 6-bit group scales ``sc`` and mins ``m`` of Q4_K and Q5_K (ggml's
  ``get_scale_min_k4``): groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
  groups 4-7 as a low nibble in bytes 8-11 (scale low, min high) and their top two bits in
  the top bits of bytes 0-3 / 4-7.
- The 2-bit low codes of Q2_K and Q3_K: for each half of 128 values, byte ``l`` (0..31)
  holds values ``l``, ``l + 32``, ``l + 64`` and ``l + 96`` in bits 0-1, 2-3, 4-5, 6-7.
"""

from __future__ import annotations

import numpy as np

from tessera.plugins.quant.kquant_common import QK_K


def pack_k4_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins ``(nb, 8)`` uint8 as the 12 bytes ``(nb, 12)``."""
    return np.concatenate(
        [ls[:, :4] | (ls[:, 4:] >> 4) << 6, lm[:, :4] | (lm[:, 4:] >> 4) << 6,
         ls[:, 4:] & 15 | (lm[:, 4:] & 15) << 4],
        axis=1,
    )  # fmt: skip


def unpack_k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 bytes ``(nb, 12)`` as 6-bit scales and mins ``(nb, 8)`` uint8."""
    sc = np.concatenate([s[:, 0:4] & 63, s[:, 8:12] & 15 | (s[:, 0:4] >> 6) << 4], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, s[:, 8:12] >> 4 | (s[:, 4:8] >> 6) << 4], axis=1)
    return sc, m


def pack_2bit(codes: np.ndarray) -> np.ndarray:
    """Codes 0..3 ``(nb, 256)`` uint8 as 64 bytes per super-block ``(nb, 64)``."""
    q = codes.reshape(-1, 2, 4, 32)  # half, quarter (l, l+32, l+64, l+96), l
    packed = q[:, :, 0] | q[:, :, 1] << 2 | q[:, :, 2] << 4 | q[:, :, 3] << 6
    return packed.reshape(-1, QK_K // 4)


def unpack_2bit(packed: np.ndarray) -> np.ndarray:
    """64 bytes per super-block ``(nb, 64)`` as codes 0..3 ``(nb, 256)`` uint8."""
    shifts = np.array([0, 2, 4, 6], np.uint8)[:, None]
    q = packed.reshape(-1, 2, 1, 32) >> shifts & 3
    return q.reshape(-1, QK_K)

"""``EX_I8``: an 8-bit absmax quant type, the example of a quant-type plugin.

Block layout (36 bytes for 32 values): the block scale ``d`` as a little-endian float32,
then 32 signed bytes ``q``. ``d = max|x| / 127``, ``q = rint(x / d)`` (ties to even) and a
value decodes as ``q * d``. It is Q8_0 with a float32 scale: 9 bits per weight.

The GGML type id is :data:`GGML_TYPE` = 8100. llama.cpp's own ids are small integers
(below 100); a plugin type takes an id far outside that range so that it never collides
with a type llama.cpp adds later. Files that use it load only where this plugin is
installed; any other tessera names the unknown type and the way out.
"""

from __future__ import annotations

import numpy as np

from tessera.contract.quant import QuantType
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

GGML_TYPE = 8100
BLOCK_SIZE = 32
TYPE_SIZE = 4 + BLOCK_SIZE


def quantize(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    blocks = x.reshape(-1, BLOCK_SIZE)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    safe = np.where(d == 0, np.float32(1), d)  # an all-zero block keeps codes of 0
    q = np.clip(np.rint(blocks / safe), -127, 127).astype(np.int8)
    out = np.concatenate([d.astype("<f4").view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // BLOCK_SIZE * TYPE_SIZE)


def split_blocks(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales ``(..., n_blocks)`` float32 and codes ``(..., n_blocks, 32)`` int8 of ``b``."""
    b = np.ascontiguousarray(b, dtype=np.uint8)
    blocks = b.reshape(*b.shape[:-1], b.shape[-1] // TYPE_SIZE, TYPE_SIZE)
    scales = blocks[..., :4].copy().view("<f4")[..., 0].astype(np.float32)
    codes = blocks[..., 4:].copy().view(np.int8)
    return scales, codes


def dequantize(b: np.ndarray) -> np.ndarray:
    scales, codes = split_blocks(b)
    values = codes.astype(np.float32) * scales[..., None]
    return values.reshape(*values.shape[:-2], values.shape[-2] * BLOCK_SIZE)


EX_I8 = QuantType("EX_I8", GGML_TYPE, BLOCK_SIZE, TYPE_SIZE, quantize, dequantize)


@hookimpl
def tessera_register_quant_types(register):
    register(EX_I8)

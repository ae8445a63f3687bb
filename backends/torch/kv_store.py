"""The torch backend's KV caches in another type than the compute dtype (the ``kv_cache``
op): f16 / bf16 / f32 are plain tensors of that dtype; q8_0 is :class:`Q8_0Rows`, the rows'
blocks of 32 values as llama.cpp stores them (a float16 scale, 32 int8 codes: 34 bytes).

Writing rounds exactly as :func:`tessera.engine.kv_types.stored_values` (the numpy
reference) does; reading gives the stored values in the compute dtype, for SDPA and the
other torch paths (the native attention reads the blocks in place instead).
"""

from __future__ import annotations

from typing import Any

import torch

#: Values per q8_0 block and its bytes.
BLOCK, BLOCK_BYTES = 32, 34
#: The plain-tensor cache types and their dtypes.
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
#: Every type the ``kv_cache`` op stores.
KV_STORE_TYPES = (*DTYPES, "q8_0")


class Q8_0Rows:
    """A q8_0 KV cache of ``shape`` ``(cells, heads, D)``: ``blocks`` uint8
    ``(cells, heads, D / 32 * 34)`` on the device."""

    cache_type = "q8_0"

    def __init__(self, shape: tuple[int, int, int], device: Any) -> None:
        cells, heads, dim = shape
        if dim % BLOCK:
            raise ValueError(f"a q8_0 cache needs rows of whole blocks of {BLOCK}, not {dim}")
        self.shape = tuple(shape)
        self.blocks = torch.zeros((cells, heads, dim // BLOCK * BLOCK_BYTES), dtype=torch.uint8)
        self.blocks = self.blocks.to(device)

    def __len__(self) -> int:
        return self.shape[0]

    def values(self, rows: Any, dtype: torch.dtype) -> torch.Tensor:
        """The stored values of ``rows`` (a slice or an index tensor) in ``dtype``."""
        b = self.blocks[rows]
        blocks = b.view(*b.shape[:-1], -1, BLOCK_BYTES)
        d = blocks[..., :2].contiguous().view(torch.float16).float()
        q = blocks[..., 2:].view(torch.int8).float()
        return (q * d).reshape(*b.shape[:-1], self.shape[2]).to(dtype)

    def write(self, rows: Any, src: torch.Tensor) -> None:
        """``rows`` (an int or an index tensor) = ``src`` ``(n, heads, D)`` rounded to q8_0."""
        packed = quantize(src)
        if isinstance(rows, int):
            self.blocks[rows].copy_(packed[0])
        else:
            self.blocks.index_copy_(0, rows, packed)


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows ``(..., D)`` as q8_0 bytes ``(..., D / 32 * 34)``: ``d = max|x| / 127`` rounded to
    float16, codes ``x * (1 / d)`` rounded half away from zero, in float32 steps exactly as
    ggml's reference quantizer (and :func:`tessera.engine.kv_types.quantize_q8_0`)."""
    v = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    d = v.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    scaled = v * inv
    a = scaled.abs()
    whole = a.floor()  # floor(|v|) + 1 when the fraction is >= 0.5, in exact steps
    q = (torch.sign(scaled) * (whole + (2 * (a - whole)).floor())).to(torch.int8)
    packed = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=-1)
    return packed.reshape(*x.shape[:-1], -1)


def make_cache(shape: tuple[int, ...], cache_type: str, device: Any) -> Any:
    """A zero-filled cache of ``cache_type`` (``q8_0``: :class:`Q8_0Rows`)."""
    if cache_type == "q8_0":
        return Q8_0Rows(shape, device)  # type: ignore[arg-type]
    return torch.zeros(shape, dtype=DTYPES[cache_type], device=device)


def cache_type_of(cache: Any) -> str:
    """The stored type of a cache: ``"q8_0"`` or the name of a tensor's dtype."""
    if isinstance(cache, Q8_0Rows):
        return "q8_0"
    return {v: k for k, v in DTYPES.items()}[cache.dtype]


def read_rows(cache: Any, rows: Any, dtype: torch.dtype) -> torch.Tensor:
    """Rows of any cache (a slice or an index tensor) as a tensor of ``dtype``."""
    if isinstance(cache, Q8_0Rows):
        return cache.values(rows, dtype)
    if isinstance(rows, slice):
        return cache[rows].to(dtype)
    return cache.index_select(0, rows).to(dtype)

"""Shared pieces of the K-quant plugins (Q2_K ... Q6_K): float32 arithmetic as ggml does it,
the packings several K-types share, and a torch weight that keeps integer codes plus
per-group scales.

Not an entry point itself; the K-quant plugin modules import it, and the legacy types'
torch kernels.

Bit-exactness with llama.cpp's reference quantizers rests on three facts, checked against
``llama-quantize`` output (tests/data/kquants, tests/data/quants):

- every operation is a float32 operation, one rounding each (no fused multiply-add);
- sums run strictly in order, as the C loops do: :func:`seq_sum` uses ``np.cumsum``,
  which accumulates sequentially (``np.sum`` sums pairwise and would not match), and
  :func:`column_sum` adds the rows of a ``(group, n_groups)`` array one after another;
- ggml's ``nearest_int`` adds 1.5 * 2**23 and keeps the low mantissa bits: round half to
  even within +-2**22, and :func:`nearest_int` reproduces its bits outside too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tessera.switches import Choice, Switch, choose, number

F32 = np.float32
QK_K = 256
#: ggml's GROUP_MAX_EPS: a group whose largest magnitude is below it counts as all zero.
GROUP_MAX_EPS = F32(1e-15)


def seq_sum(values: np.ndarray) -> np.ndarray:
    """Float32 sum over the last axis, left to right, as a C ``for`` loop adds."""
    return np.cumsum(values, axis=-1, dtype=F32)[..., -1]


def column_sum(values: np.ndarray) -> np.ndarray:
    """Float32 sum over the first axis, first row to last, as a C ``for`` loop adds: with
    each group's values down a column, one vector add per row (~20x faster than
    :func:`seq_sum` along rows of 16 or 32)."""
    total = values[0].astype(F32, copy=True)
    for row in values[1:]:
        total += row
    return total


def nearest_int(values: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` bit for bit, as float32: round half to even within +-2**22;
    beyond, the C trick's wrapped result (NaN gives 0, infinities -2**22), which clamping
    then maps as llama.cpp does."""
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = np.asarray(values, dtype=F32) + F32(12582912)
    return ((shifted.view(np.int32) & 0x007FFFFF) - 0x00400000).astype(F32)


def first_argmax(values: np.ndarray) -> np.ndarray:
    """Index of the first maximum along the last axis (C's ``if (v > best)`` scan)."""
    return np.argmax(values, axis=-1)


def fp16_value(halves: np.ndarray) -> np.ndarray:
    """Bytes ``(..., 2)`` of little-endian float16 values as float32 ``(..., 1)``."""
    return np.ascontiguousarray(halves).view("<f2").astype(F32)


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to IEEE half (nearest even, as GGML_FP32_TO_FP16), as bytes."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(values, dtype=F32).astype("<f2").reshape(-1, 1).view(np.uint8)


class TorchGroupedWeight:
    """A K-quant weight on a torch backend: integer codes plus per-group scale and offset.

    ``value = code * scale - offset`` per group of ``codes.shape[-1]`` inputs. Codes stay
    in ``int8`` / ``uint8`` (one byte per weight instead of two for bf16); each matmul
    dequantizes to the compute dtype. Implements the torch backend's quantized-weight
    interface: ``shape``, ``matmul(x)`` and ``get_rows(ids)``.
    """

    def __init__(self, codes: Any, scales: Any, offsets: Any | None, dtype: Any) -> None:
        self.codes = codes  # (n_out, n_groups, group)
        self.scales = scales  # (n_out, n_groups, 1), compute dtype
        self.offsets = offsets  # same shape, or None
        self.dtype = dtype
        n_out, n_groups, group = codes.shape
        self.shape = (n_out, n_groups * group)

    def _dense(self, codes: Any, scales: Any, offsets: Any | None) -> Any:
        values = codes.to(self.dtype) * scales
        if offsets is not None:
            values = values - offsets
        return values.flatten(-2)

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        return F.linear(x, self._dense(self.codes, self.scales, self.offsets).to(x.dtype))

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch

        index = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.codes.device)
        offsets = None if self.offsets is None else self.offsets[index]
        return self._dense(self.codes[index], self.scales[index], offsets)


def torch_grouped_weight(
    backend: Any, codes: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None
) -> TorchGroupedWeight:
    """Move numpy codes ``(n_out, n_groups, group)`` and float32 scales/offsets to the device."""
    import torch

    device, dtype = backend.torch_device, backend.torch_dtype

    def put(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=F32)).to(device=device, dtype=dtype)

    return TorchGroupedWeight(
        torch.from_numpy(np.ascontiguousarray(codes)).to(device),
        put(scales),
        None if offsets is None else put(offsets),
        dtype,
    )


def dequantize_with_mins(
    b: np.ndarray, unpack: Callable[[np.ndarray], tuple[np.ndarray, ...]], group: int, size: int
) -> np.ndarray:
    """``scale * q - offset`` of the bytes ``b`` of a type of ``size`` bytes per super-block
    (Q2_K, Q4_K, Q5_K): ``unpack(b)`` gives the per-group scales and offsets ``(nb,
    n_groups)`` and the codes ``(nb, QK_K)``, ``group`` codes a group."""
    with np.errstate(invalid="ignore"):  # a stored scale may be infinite or NaN
        scale, offset, codes = unpack(b)
        values = scale[..., None] * codes.reshape(*scale.shape, group).astype(F32)
        values -= offset[..., None]
    return values.reshape(*b.shape[:-1], b.shape[-1] // size * QK_K)


def torch_weight_with_mins(
    backend: Any, raw: Any, unpack: Callable[[np.ndarray], tuple[np.ndarray, ...]], group: int
) -> TorchGroupedWeight:
    """The :class:`TorchGroupedWeight` of such a type: uint8 codes plus one scale and one
    offset per ``group`` codes."""
    n_out = raw.shape[0]
    scale, offset, codes = unpack(np.asarray(raw.data).reshape(n_out, -1))
    shape = (n_out, -1, 1)
    return torch_grouped_weight(
        backend, codes.reshape(n_out, -1, group), scale.reshape(shape), offset.reshape(shape)
    )


def torch_grouped_kernel(qtype: Any, load: Any, description: str) -> Any:
    """The torch :class:`~tessera.contract.quant.WeightKernel` of a K-quant type, with its probe.

    The probe declines on the CPU: there a weight dequantized once to the compute dtype
    (the backend's fallback) multiplies ~6x faster than dequantizing per matmul, for 1 row
    and for 128 (bench/quant_types.py), at twice the memory. Elsewhere it runs one tiny
    matmul against numpy's dequantize, cached per backend.
    """
    from tessera.contract.quant import WeightKernel, kernel_matches_reference

    def supports(backend: Any) -> bool:
        if getattr(backend, "name", "") != "torch" or backend.torch_device.type == "cpu":
            return False
        cache = backend.probe_cache
        if qtype.name not in cache:
            cache[qtype.name] = kernel_matches_reference(backend, qtype, load)
        return cache[qtype.name]

    return WeightKernel("torch", qtype.name, supports, load, description)


class TorchInt4DenseWeight:
    """A 4-bit K-quant weight on the CPU kept twice: torch's int4 groupwise layout for
    decode (fewer than ``dense_min_rows`` rows: ~0.6 bytes read per weight) and the weight
    dequantized once to the compute dtype for prefill (the AMX/AVX512 matmul beats both the
    int4 kernel and per-matmul dequantization there) and ``get_rows``: 2.6 bytes per
    weight in memory instead of 2, for ~3x less memory traffic per decoded token."""

    def __init__(self, dense: Any, int4: tuple[Any, Any, Any], dense_min_rows: float) -> None:
        self.dense = dense
        self.mm, self.packed, self.scales_and_zeros = int4
        self.dense_min_rows = dense_min_rows
        self.shape = tuple(dense.shape)

    def matmul(self, x: Any) -> Any:
        import torch.nn.functional as F

        if x.shape[0] >= self.dense_min_rows:
            return F.linear(x, self.dense)
        y = self.mm(x, self.packed, 32, self.scales_and_zeros)
        return y if y.shape[-1] == self.shape[0] else y[:, : self.shape[0]]

    def get_rows(self, ids: np.ndarray) -> Any:
        import torch
        import torch.nn.functional as F

        return F.embedding(torch.from_numpy(np.asarray(ids, dtype=np.int64)), self.dense)


def choose_int4_rows(backend: Any, switch: Switch) -> Choice:
    """Rows from which a 4-bit K-quant matmul dequantizes instead of using torch's int4
    kernel (the Choice's path); 0 where that kernel is not used: float32 on the CPU (there
    it is ~30x slower than a dequantized matmul) or ``switch`` set to 0. ``switch`` may
    give another row count."""
    rows = number(switch)
    if rows is not None:
        why = f"{switch.name}={rows:g}"
    elif backend.dtype == "f32":
        rows, why = 0.0, "float32 on the CPU: torch's int4 kernel is ~30x slower there"
    else:
        rows, why = 16.0, f"decode (fewer than 16 rows) in {backend.dtype}"
    return choose(switch, (rows > 0, why), on=rows, off=0.0)


def int4_or_grouped(
    backend: Any,
    name: str,
    switch: Switch,
    codes: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray,
    min_rows: float | None = None,
) -> Any:
    """The torch weight of a type whose value is ``code * scale - offset`` per group of 32,
    codes 0..15 ``(n_out, n_groups, 32)``, ``scale`` and ``offset`` ``(n_out, n_groups)``
    (Q4_K, Q4_1): a :class:`TorchGroupedWeight`, and on the CPU in bf16/f16 a
    :class:`TorchInt4DenseWeight` instead (``(q - 8) * s + (8 s - offset)`` is ``s * q -
    offset``: the int4 kernel's form), from ``min_rows`` rows (default: ``switch``'s
    :func:`choose_int4_rows`, recorded as the backend's path) on its dense copy."""
    from tessera.plugins.quant.q4_0 import int4_ops, pack_int4

    n_out = codes.shape[0]
    shape = (n_out, -1, 1)
    grouped = torch_grouped_weight(backend, codes, scale.reshape(shape), offset.reshape(shape))
    if backend.torch_device.type != "cpu":
        return grouped
    if min_rows is None:  # (the probe passes its own)
        min_rows = backend.record_path(f"{name} int4 rows", choose_int4_rows(backend, switch)).path
    ops = int4_ops("cpu")
    if min_rows <= 0 or ops is None:
        return grouped
    dense = grouped.get_rows(np.arange(n_out))  # dequantized once, for prefill
    packed, sz = pack_int4(
        codes.reshape(n_out, -1), scale, 8 * scale - offset, backend.torch_device,
        backend.torch_dtype,
    )  # fmt: skip
    return TorchInt4DenseWeight(dense, (ops[1], packed, sz), min_rows)


def int4_kernel(qtype: Any, load: Any, switch: Switch, description: str) -> Any:
    """The torch :class:`~tessera.contract.quant.WeightKernel` of a type loaded by
    :func:`int4_or_grouped`. Its probe declines on the CPU where the int4 decode path is not
    used (there a weight dequantized once at load multiplies faster than one dequantized per
    matmul); elsewhere it runs one tiny matmul of that path against numpy, cached."""
    from functools import partial
    from math import inf

    from tessera.contract.quant import WeightKernel, kernel_matches_reference
    from tessera.plugins.quant.q4_0 import int4_ops

    def supports(backend: Any) -> bool:
        if getattr(backend, "name", "") != "torch":
            return False
        if backend.torch_device.type == "cpu" and (
            choose_int4_rows(backend, switch).path <= 0 or int4_ops("cpu") is None
        ):
            return False
        cache = backend.probe_cache
        if qtype.name not in cache:
            cache[qtype.name] = kernel_matches_reference(
                backend, qtype, partial(load, min_rows=inf)
            )
        return cache[qtype.name]

    return WeightKernel("torch", qtype.name, supports, load, description)

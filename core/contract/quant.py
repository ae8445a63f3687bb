"""Tensor storage types: the data a quant-type plugin registers, and helpers around it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class QuantType:
    """A GGML tensor type: block layout plus numpy (de)quantization, bit-exact with GGUF.

    ``quantize(x)`` takes float32 values of shape ``(..., n)`` with ``n`` a multiple of
    ``block_size`` and returns ``uint8`` bytes of shape ``(..., n // block_size * type_size)``.
    ``dequantize(b)`` is its inverse: ``uint8`` ``(..., nbytes)`` to float32 ``(..., n)``.

    ``read_only`` marks a type tessera decodes but cannot encode (llama.cpp makes the IQ1,
    IQ2 and IQ3 types only with an importance matrix): its ``quantize`` raises
    :class:`~tessera.errors.TesseraError` saying why and what to use instead, and the
    conformance kits check its decoding on stored bytes instead of round trips.
    """

    name: str
    ggml_type: int
    block_size: int
    type_size: int
    quantize: Callable[[np.ndarray], np.ndarray] = attrs.field(eq=False, repr=False)
    dequantize: Callable[[np.ndarray], np.ndarray] = attrs.field(eq=False, repr=False)
    read_only: bool = False

    def row_bytes(self, n: int) -> int:
        """Bytes used by a row of ``n`` values."""
        if n % self.block_size:
            raise ValueError(
                f"{self.name} stores rows in blocks of {self.block_size} values; a row of {n} "
                "values does not fit — pick a type with smaller blocks (e.g. F16)"
            )
        return n // self.block_size * self.type_size

    def dequantize_tensor(self, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Decode a flat byte buffer into a float32 array of ``shape`` (numpy order)."""
        n_cols = shape[-1] if shape else 1
        rows = data.reshape(-1, self.row_bytes(n_cols))
        return self.dequantize(rows).reshape(shape).astype(np.float32, copy=False)

    def quantize_tensor(self, values: np.ndarray) -> np.ndarray:
        """Encode a float array into a flat ``uint8`` buffer in GGUF layout."""
        values = np.ascontiguousarray(values, dtype=np.float32)
        n_cols = values.shape[-1] if values.ndim else 1
        self.row_bytes(n_cols)
        return self.quantize(values.reshape(-1, n_cols)).reshape(-1)


@attrs.frozen
class WeightKernel:
    """A backend-specific way to keep and multiply weights of one quant type.

    ``supports(backend) -> bool`` is the capability probe. ``load(backend, raw)`` receives a
    :class:`tessera.files.gguf.RawTensor` and returns a backend weight object (whatever the
    backend's ``matmul`` accepts; see :meth:`tessera.contract.backend.Backend.load_weight`).
    """

    backend: str
    quant_type: str
    supports: Callable[[Any], bool] = attrs.field(eq=False, repr=False)
    load: Callable[[Any, Any], Any] = attrs.field(eq=False, repr=False)
    description: str = ""


def kernel_matches_reference(
    backend: Any, qtype: QuantType, load: Callable[[Any, Any], Any], n_out: int = 16
) -> bool:
    """The shared core of a weight kernel's probe: load a small random weight with ``load``,
    multiply on ``backend``, and compare with numpy's dequantize-then-matmul.

    Any exception (a missing op, an unsupported device or dtype) means "not supported".
    The tolerance allows bf16/f16 compute.
    """
    from tessera.files.gguf import RawTensor

    rng = np.random.default_rng(0)
    w = rng.standard_normal((n_out, 2 * qtype.block_size)).astype(np.float32)
    x = rng.standard_normal((2, 2 * qtype.block_size)).astype(np.float32)
    raw = RawTensor("probe", qtype.ggml_type, w.shape, qtype.quantize_tensor(w))
    want = x @ qtype.dequantize_tensor(raw.data, w.shape).T
    try:
        got = backend.to_numpy(backend.matmul(backend.from_numpy(x), load(backend, raw)))
    except Exception:
        return False
    return bool(np.allclose(got, want, rtol=5e-2, atol=5e-2 * np.abs(want).max()))


def file_bytes_tensor(a: np.ndarray) -> Any:
    """A torch CPU tensor sharing the memory of ``a`` (GGUF bytes, usually a read-only view
    of the memory-mapped file): no copy in RAM. torch warns that it cannot protect
    read-only memory; kernels only ever read these bytes, so the warning is silenced."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)

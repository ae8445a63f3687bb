"""The torch backend's weight ops: loading a weight and the ops that multiply by one
(``matmul``, ``matmul_n``, ``gate_up_swiglu``, ``linear``, ``matmul_heads``) or read its
rows (``get_rows``).

Loaded weights are either plain tensors in the compute dtype (float types, and quantized
types without a usable kernel, dequantized once) or objects made by a quant type's
:class:`~tessera.contract.quant.WeightKernel` that implement this interface:

- ``shape``: ``(n_out, n_in)``;
- ``matmul(x)``: ``x @ W.T`` for ``x`` a ``(T, n_in)`` tensor, result ``(T, n_out)`` in
  ``x``'s dtype;
- ``get_rows(ids)``: rows ``ids`` (a numpy int array) of ``W`` as a ``(len(ids), n_in)``
  tensor in the backend's compute dtype on its device.

Kernels read ``backend.torch_device``, ``backend.torch_dtype`` and cache their probe
answers in ``backend.probe_cache`` (a dict keyed by quant type name).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.native.amx_f32 import tiles_f32
from tessera.backends.torch.activations import to_dtype
from tessera.backends.torch.dense_native import DENSE_KINDS, dense_gemv, dense_native, f32_prefill
from tessera.backends.torch.packed import PackedLinear, epilogue
from tessera.switches import DISABLE_KERNELS, names

#: Weights per native matmul_n call (tessera.backends.native.kernels.MAX_WEIGHTS).
MAX_NATIVE_WEIGHTS = 8


def disabled_kernels() -> set[str]:
    """Quant types whose kernels ``TESSERA_DISABLE_KERNELS`` switches off ("all": every one)."""
    return {n.upper() for n in names(DISABLE_KERNELS)}


#: The most values a widened 16-bit weight takes from the reused buffer (256 MB of float32:
#: every layer matrix of an 8B model; its LM head is larger).
MAX_WIDEN_BUFFER = 64 << 20


class WeightOps:
    """The weight ops of :class:`~tessera.backends.torch.ops.TorchBackend` (a mixin: its
    ``_kernels`` and ``_packed_linear`` are set up in ``TorchBackend.__init__``)."""

    def load_weight(self, raw: Any, qtype: Any) -> Any:
        if len(raw.shape) == 2:  # chosen while the weights load (their switches are read then)
            dense_native(self)
            f32_prefill(self)
        kernel = self._kernels.get(qtype.name) if len(raw.shape) == 2 else None
        if kernel is None:
            reason = f"no torch kernel for {qtype.name}"
        elif {qtype.name.upper(), "ALL"} & disabled_kernels():
            reason = f"{qtype.name} kernel disabled by TESSERA_DISABLE_KERNELS"
        elif not kernel.supports(self):
            reason = f"{qtype.name} kernel declined by its probe on {self.device}/{self.dtype}"
        else:
            self.record(raw.name, f"kernel {qtype.name}", kernel.description or "kernel")
            return kernel.load(self, raw)
        values = qtype.dequantize_tensor(raw.data, raw.shape)
        if len(raw.shape) == 1 and self.act_dtype != self.torch_dtype:
            # norm weights and biases act on float32 activations: kept in float32 (the file's
            # F32 values unrounded, as llama.cpp keeps them)
            self.record(raw.name, f"dequantize {qtype.name}->f32", "a 1-D tensor: f32 activations")
            return self._tensor(values).to(self.torch_device, self.act_dtype)
        self.record(raw.name, f"dequantize {qtype.name}->{self.dtype}", reason)
        return self.from_numpy(values)

    def matmul(self, x: torch.Tensor, w: Any) -> torch.Tensor:
        if self.act_dtype == self.torch_dtype:
            return self._matmul(x, w)
        # Float32 activations (the result float32 whatever x's dtype): a native GEMV and the
        # VNNI GEMM take x as it is, the AMX tiles take it rounded to bf16, all return the
        # float32 sums; so do 16-bit weights on the float32 prefill path; every other path
        # multiplies in the compute dtype, x rounded to it, and rounds.
        tiles = self._tiles_of(w, x.shape[0])
        if tiles is not None:
            y = tiles_f32(self._native(), tiles[0], (tiles[1],), x)
            if y is not None:
                return y
        if self._native_gemv(w, x.shape[0]) is None:
            if self._f32_prefill(w):
                return F.linear(to_dtype(x, torch.float32), self._widened(w, torch.float32))
            x = to_dtype(x, self.torch_dtype)
        return to_dtype(self._matmul(x, w), self.act_dtype)

    def _matmul(self, x: torch.Tensor, w: Any) -> torch.Tensor:
        """``x @ w.T`` in ``x``'s dtype (the native GEMV, torch, or the weight's kernel)."""
        if isinstance(w, torch.Tensor):
            found = dense_gemv(self, w, x.shape[0])
            if found is not None:  # decode: the native GEMV reads the 16-bit rows once
                return dense_native(self).gemv_dense(found[0], (w,), x)
            if w.dtype == torch.float16 and x.dtype == torch.bfloat16:
                tiles = self._tiles_of(w, x.shape[0])  # an F16 file's values kept in place
                y = self._native().matmul_tiles(*tiles, x) if tiles else None
                if y is not None:
                    return y
            return F.linear(x, self._widened(w, x.dtype))
        return w.matmul(x)

    def _widened(self, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``w`` in ``dtype`` for one prefill matmul: a float32 default's 16-bit weight
        widened, or an F16 weight kept in place (for the AMX tiles) rounded to bf16 where
        they do not take the matmul, into a buffer the next one reuses (a fresh tensor
        faulted in its pages: 3.8 ms against 0.5 ms for a 4864x896 weight); weights over
        :data:`MAX_WIDEN_BUFFER` values (an LM head) get a tensor of their own."""
        if w.dtype == dtype or not w.is_floating_point():
            return w
        n = w.numel()
        if n > MAX_WIDEN_BUFFER or w.device.type != "cpu":
            return w.to(dtype)
        buf = self._widen_buffer
        if buf is None or buf.numel() < n or buf.dtype != dtype:
            buf = self._widen_buffer = torch.empty(n, dtype=dtype)
        return buf[:n].view(w.shape).copy_(w)

    def _f32_prefill(self, w: Any) -> bool:
        """Whether ``w`` (not on a native kernel at this row count) multiplies in float32:
        a plain 16-bit CPU tensor where :func:`f32_prefill` chose that path."""
        is_dense = isinstance(w, torch.Tensor) and w.dtype in DENSE_KINDS
        return is_dense and w.device.type == "cpu" and f32_prefill(self)

    def _takes_f32(self, w: Any, n_rows: int) -> bool:
        """Whether a matmul of ``n_rows`` float32 rows by ``w`` reads them unrounded (a
        native GEMV, or the float32 prefill path)."""
        return self._native_gemv(w, n_rows) is not None or self._f32_prefill(w)

    def _tiles_of(self, w: Any, n_rows: int) -> tuple[str, Any] | None:
        """``(kind, what the AMX tiles read)`` when a matmul of ``n_rows`` rows by ``w`` can
        run on them: a quantized weight's ``native_tiles``, or a plain 2-D bf16 / f16 CPU
        tensor (``"BF16"`` / ``"F16"``) where the tiles serve this shape; else None."""
        if not isinstance(w, torch.Tensor):
            return getattr(w, "native_tiles", _no_native)(n_rows)
        native = self._native()
        kind = DENSE_KINDS.get(w.dtype)
        if native is None or kind is None or w.dim() != 2 or not w.is_contiguous():
            return None
        if f32_prefill(self):  # chosen (or forced) over the tiles
            return None
        ok = w.device.type == "cpu" and native.tiles_serve(n_rows, w.shape[0], torch.bfloat16)
        return (kind, w) if ok and w.shape[1] % 32 == 0 else None

    def _native_gemv(self, w: Any, n_rows: int) -> tuple[str, Any] | None:
        """``(kind, what the native kernel reads)`` when a matmul of ``n_rows`` rows by ``w``
        runs a native GEMV (quantized weights: their ``native_gemv``; plain 16-bit tensors:
        the dense GEMV), else None."""
        if isinstance(w, torch.Tensor):
            return dense_gemv(self, w, n_rows)
        return getattr(w, "native_gemv", _no_native)(n_rows)

    def matmul_n(self, x, weights, biases=None):
        """One native call for weights that all run the same native kernel at this row
        count (decode's Q/K/V and gate/up); otherwise one matmul (and add) per weight."""
        biases = tuple(biases) if biases is not None else (None,) * len(weights)
        native = self._native() if 1 < len(weights) <= MAX_NATIVE_WEIGHTS else None
        if native is not None:
            found = [self._native_gemv(w, x.shape[0]) for w in weights]
            if all(found) and len({kind for kind, _ in found}) == 1:
                if x.dtype != self.torch_dtype:  # float32 activations: float32 bias copies
                    biases = tuple(self._f32_weight(b) for b in biases)
                if all(b is None or (b.dtype == x.dtype and b.is_contiguous()) for b in biases):
                    raws = tuple(raw for _, raw in found)
                    y = native.matmul_n(found[0][0], raws, x, biases)
                    return list(y.split([w.shape[0] for w in weights], dim=1))
        if self.act_dtype != self.torch_dtype:
            if not any(self._takes_f32(w, x.shape[0]) for w in weights):
                x = to_dtype(x, self.torch_dtype)  # rounded once for all (prefill Q/K/V)
        return super().matmul_n(x, weights, biases)

    def gate_up_swiglu(self, x, w_gate, w_up):
        """One AMX pass (gate and up tiles side by side, silu(gate) * up formed in float32)
        where both weights have a native tile kernel at this row count; else the default.

        With float32 activations the tiles' product is rounded once to bf16 (dense bf16
        weights too): it is the down projection's input, which rounds it to bf16 anyway.
        Where the tiles do not serve and no native GEMV takes the rows, the matmuls and the
        product run in the compute dtype."""
        native = self._native()
        if self.act_dtype != self.torch_dtype:
            found = [self._tiles_of(w, x.shape[0]) for w in (w_gate, w_up)]
            if native is not None and all(found) and found[0][0] == found[1][0]:
                y = tiles_f32(native, found[0][0], (found[0][1], found[1][1]), x, out_f32=False)
                if y is not None:
                    return y
            if not any(self._takes_f32(w, x.shape[0]) for w in (w_gate, w_up)):
                # matmuls in the compute dtype (dequantized K-quants, shapes the tiles do not
                # take) round gate and up anyway: their product stays in it too, without two
                # conversions to float32 and one back (a fifth of a K-quant prefill)
                x = to_dtype(x, self.torch_dtype)
                return F.silu(self._matmul(x, w_gate)) * self._matmul(x, w_up)
        elif native is not None:
            found = [getattr(w, "native_tiles", _no_native)(x.shape[0]) for w in (w_gate, w_up)]
            if all(found) and found[0][0] == found[1][0]:
                y = native.swiglu_tiles(found[0][0], found[0][1], found[1][1], x)
                if y is not None:
                    return y
        return super().gate_up_swiglu(x, w_gate, w_up)

    def matmul_heads(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # (H, T, K) @ (H, K, N): one batched matmul over the heads, back to (T, H, N)
        return torch.bmm(x.transpose(0, 1), w.transpose(1, 2).to(x.dtype)).transpose(0, 1)

    def get_rows(self, w: Any, ids: np.ndarray) -> torch.Tensor:
        # rows of a weight (token embeddings) enter the activations in their dtype
        rows = F.embedding(self._index(ids), w) if isinstance(w, torch.Tensor) else w.get_rows(ids)
        # (and 16-bit weights kept as the file's values in another compute dtype widen here)
        widen = rows.dtype == self.torch_dtype or rows.dtype in DENSE_KINDS
        return to_dtype(rows, self.act_dtype) if widen else rows

    def linear(self, x, w, bias, activation="", residual=None):
        if isinstance(w, torch.Tensor):
            if self._packed_linear is None:
                self._packed_linear = PackedLinear(self)
            if x.dtype == w.dtype:
                return self._packed_linear(x, w, bias, activation, residual)
        return epilogue(self.matmul(x, w) + bias, activation, residual)


def _no_native(n_rows: int) -> None:
    """``native_gemv`` of weights without a native kernel (plain tensors, other types)."""
    return None

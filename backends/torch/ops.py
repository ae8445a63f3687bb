"""The torch backend's ops: every op of :mod:`tessera.contract.backend` on torch tensors.

Imported only when a torch backend is created (see :mod:`tessera.backends.torch.backend`).

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

Autograd: no tensor made here requires grad, so torch records no graph. Callers may run
the forward pass inside ``torch.inference_mode()`` to also skip version counting; every
op works inside and outside it (``set_rows`` enters it for caches created inside it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.native.kernels import RowLists
from tessera.backends.torch import block as torch_block
from tessera.backends.torch.packed import PackedLinear, epilogue
from tessera.contract.backend import CORE_OPS, OPTIONAL_OPS, Backend

TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def disabled_kernels() -> set[str]:
    """Quant types whose kernels ``TESSERA_DISABLE_KERNELS`` switches off ("all": every one)."""
    names = os.environ.get("TESSERA_DISABLE_KERNELS", "")
    return {n.strip().upper() for n in names.split(",") if n.strip()}


class TorchBackend(Backend):
    name = "torch"

    def __init__(self, device: torch.device, dtype: str) -> None:
        super().__init__()
        self.torch_device = device
        self.torch_dtype = TORCH_DTYPES[dtype]
        self.device = str(device)
        self.dtype = dtype
        #: Probe answers of weight kernels, by quant type name (filled by the kernels), and
        #: "native": the native decode kernels' status (tessera.backends.native.kernels).
        self.probe_cache: dict[str, Any] = {}
        self._kernels: dict[str, Any] = {}
        self._inv_freq: dict[tuple[int, float, float], torch.Tensor] = {}
        self._rope_tables: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self._mask_inputs: tuple[np.ndarray, tuple[torch.Tensor, torch.Tensor]] | None = None
        self._rows_inputs: tuple[Any, dict[str, Any]] | None = None
        self._fused_norm: bool | None = None  # probed on first use
        self._f32_weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # decoder_block's C structs: per block (by id, the block kept with it) and per ubatch
        self._block_structs: dict[int, tuple[Any, Any]] = {}
        self._block_step: tuple[Any, ...] | None = None
        self._packed_linear: PackedLinear | None = None  # made on first use

    # -- capability probe and setup --------------------------------------------------

    def supports(self, op: str, **attrs: Any) -> bool:
        if op not in CORE_OPS + OPTIONAL_OPS:
            return False
        if op in ("rope", "rope_ext"):
            n_rot, head_dim = attrs.get("n_rot", 0), attrs.get("head_dim")
            return n_rot % 2 == 0 and (head_dim is None or n_rot <= head_dim)
        if op == "decoder_block":
            return self._native() is not None and not torch_block.disabled()
        if op in ("attention", "attention_rows"):
            n_head, n_head_kv = attrs.get("n_head", 1), attrs.get("n_head_kv", 1)
            return n_head_kv > 0 and n_head % n_head_kv == 0
        return True

    def use_kernels(self, kernels: Mapping[tuple[str, str], Any]) -> None:
        self._kernels = {qt: k for (backend, qt), k in kernels.items() if backend == self.name}

    def set_threads(self, n_threads: int) -> None:
        if n_threads > 0:
            torch.set_num_threads(n_threads)

    # -- arrays ----------------------------------------------------------------------

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        a = np.asarray(a)
        if not (a.flags.writeable and a.flags.c_contiguous):
            a = np.array(a)  # torch.from_numpy wants memory it may own a view of
        return torch.from_numpy(a)

    def from_numpy(self, a: np.ndarray) -> torch.Tensor:
        t = self._tensor(a)
        if t.is_floating_point():
            return t.to(device=self.torch_device, dtype=self.torch_dtype)
        return t.to(self.torch_device)

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        x = x.detach()
        if x.is_floating_point():
            x = x.float()
        return x.cpu().numpy()

    def zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.torch_dtype, device=self.torch_device)

    def _index(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.torch_device)

    def load_weight(self, raw: Any, qtype: Any) -> Any:
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
        self.record(raw.name, f"dequantize {qtype.name}->{self.dtype}", reason)
        return self.from_numpy(qtype.dequantize_tensor(raw.data, raw.shape))

    # -- ops -------------------------------------------------------------------------

    def matmul(self, x: torch.Tensor, w: Any) -> torch.Tensor:
        if isinstance(w, torch.Tensor):
            return F.linear(x, w)
        return w.matmul(x)

    def matmul_n(self, x, weights, biases=None):
        """One native call for weights that all run the same native kernel at this row
        count (decode's Q/K/V and gate/up); otherwise one matmul (and add) per weight."""
        biases = tuple(biases) if biases is not None else (None,) * len(weights)
        native = self._native() if 1 < len(weights) <= MAX_NATIVE_WEIGHTS else None
        if native is not None:
            found = [getattr(w, "native_gemv", _no_native)(x.shape[0]) for w in weights]
            if all(found) and len({kind for kind, _ in found}) == 1:
                if all(b is None or (b.dtype == x.dtype and b.is_contiguous()) for b in biases):
                    raws = tuple(raw for _, raw in found)
                    y = native.matmul_n(found[0][0], raws, x, biases)
                    return list(y.split([w.shape[0] for w in weights], dim=1))
        return super().matmul_n(x, weights, biases)

    def gate_up_swiglu(self, x, w_gate, w_up):
        """One AMX pass (gate and up tiles side by side, silu(gate) * up formed in float32)
        where both weights have a native tile kernel at this row count; else the default."""
        native = self._native()
        if native is not None:
            found = [getattr(w, "native_tiles", _no_native)(x.shape[0]) for w in (w_gate, w_up)]
            if all(found) and found[0][0] == found[1][0]:
                y = native.swiglu_tiles(found[0][0], found[0][1], found[1][1], x)
                if y is not None:
                    return y
        return super().gate_up_swiglu(x, w_gate, w_up)

    def get_rows(self, w: Any, ids: np.ndarray) -> torch.Tensor:
        if isinstance(w, torch.Tensor):
            return F.embedding(self._index(ids), w)
        return w.get_rows(ids)

    def add(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def mul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b

    def scale(self, x: torch.Tensor, s: float) -> torch.Tensor:
        return x * s

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        # Statistics in float32: a bf16 sum of squares over thousands of values loses bits.
        native = self._native()
        if native is not None:
            # one C call instead of torch's composite (decode: two norms per layer per
            # token; prefill: 512 x 896 rows in 0.2 ms instead of 1 ms at two threads)
            return native.rms_norm(x, self._f32_weight(weight), eps)
        if self._fused_norm is None:
            self._fused_norm = fused_rms_norm_ok(self)
        if self._fused_norm:  # one kernel instead of seven: decode runs two per layer
            w = None if weight is None else weight.float()
            return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)
        return self._rms_norm_ops(x, weight, eps)

    def _native(self) -> Any:
        """The native CPU kernels (tessera.backends.native.kernels) or None; probed once, the
        answer kept in ``probe_cache["native"]``."""
        status = self.probe_cache.get("native")
        if status is None:
            from tessera.backends.native import kernels as native_gemv

            status = native_gemv.status(self)
        return status.gemv

    def _f32_weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        """A float32 copy of a norm weight, made once (the weight is kept with it, so its
        id is not reused while cached)."""
        if weight is None:
            return None
        hit = self._f32_weights.get(id(weight))
        if hit is None:
            hit = self._f32_weights[id(weight)] = (weight, weight.float().contiguous())
        return hit[1]

    def _rms_norm_ops(
        self, x: torch.Tensor, weight: torch.Tensor | None, eps: float
    ) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
        if weight is not None:
            y = y * weight.float()
        return y.to(x.dtype)

    def layer_norm(
        self, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
    ) -> torch.Tensor:
        dt = x.dtype  # (no generator here: 13 calls per BERT forward)
        if (weight is None or weight.dtype == dt) and (bias is None or bias.dtype == dt):
            # torch normalizes bf16/f16 in float32 internally and rounds once at the end
            return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
        xf = x.float()
        w = None if weight is None else weight.float()
        b = None if bias is None else bias.float()
        return F.layer_norm(xf, (x.shape[-1],), w, b, eps).to(x.dtype)

    def _rope_table(
        self,
        positions: np.ndarray,
        n_rot: int,
        freq_base: float,
        freq_scale: float,
        freq_factors: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``(T, 1, n_rot/2)`` in the compute dtype, cached for the last positions.

        Every layer of a forward pass rotates at the same positions, so the table is built
        once per ubatch; angles are computed in float64 (positions reach 1e5 and more).
        """
        pos = np.ascontiguousarray(positions, dtype=np.int64)
        factors = None if freq_factors is None else np.asarray(freq_factors, np.float64)
        factors_key = None if factors is None else factors.tobytes()
        key = (pos.tobytes(), n_rot, freq_base, freq_scale, factors_key)
        table = self._rope_tables.get(key)
        if table is None:
            freq_key = (n_rot, freq_base, freq_scale, factors_key)
            if freq_key not in self._inv_freq:
                exponent = torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot
                inv_freq = freq_scale * freq_base**-exponent
                if factors is not None:
                    inv_freq = inv_freq / torch.from_numpy(factors)
                self._inv_freq[freq_key] = inv_freq
            angle = torch.from_numpy(pos).double()[:, None] * self._inv_freq[freq_key]
            table = tuple(
                t.to(device=self.torch_device, dtype=self.torch_dtype)[:, None, :]
                for t in (angle.cos(), angle.sin())
            )
            if len(self._rope_tables) >= 8:  # a few rope configs per model, one ubatch each
                self._rope_tables.pop(next(iter(self._rope_tables)))
            self._rope_tables[key] = table
        return table

    def rope(self, x, positions, n_rot, freq_base, neox, freq_scale=1.0):
        return self.rope_ext(x, positions, n_rot, freq_base, neox, freq_scale, None)

    def rope_ext(self, x, positions, n_rot, freq_base, neox, freq_scale, freq_factors):
        cos, sin = self._rope_table(positions, n_rot, freq_base, freq_scale, freq_factors)
        native = self._native() if x.numel() < NATIVE_SMALL_OP_VALUES and x.dim() == 3 else None
        if native is not None:
            return native.rope(x, cos, sin, n_rot, neox)  # decode: one C call
        return rotate(x, cos, sin, n_rot, neox)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")

    def swiglu(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up

    def tanh(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)

    def gelu_erf(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    def linear(self, x, w, bias, activation="", residual=None):
        if isinstance(w, torch.Tensor):
            if self._packed_linear is None:
                self._packed_linear = PackedLinear(self)
            return self._packed_linear(x, w, bias, activation, residual)
        return epilogue(w.matmul(x) + bias, activation, residual)

    def attention(self, q, k_cache, v_cache, n_kv, mask, scale):
        n_tokens, n_head, _ = q.shape
        n_head_kv = k_cache.shape[1]
        allowed, dead = self._mask_tensors(mask)
        # (1, H, T, D) views; GQA without copying K/V. With a batch axis SDPA takes its
        # fused CPU kernel (3-D inputs fall back to the slow unfused path: 5-8x slower).
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k_cache[:n_kv].transpose(0, 1)[None],
            v_cache[:n_kv].transpose(0, 1)[None],
            attn_mask=allowed,
            scale=scale,
            enable_gqa=n_head != n_head_kv,
        )[0]
        if dead is not None:
            # A query with no allowed cell must give zeros; some SDPA kernels give NaN there.
            out = out.masked_fill(dead, 0.0)
        return out.transpose(0, 1).reshape(n_tokens, -1)

    def _mask_tensors(self, mask: np.ndarray) -> tuple[Any, Any]:
        """The dense mask and its all-masked rows as tensors, made once per ubatch: every
        layer passes the same numpy mask (held here, so ``is`` cannot match a new one).
        None for a mask that allows everything (one sequence of an encoder) and for "no
        dead row": SDPA without a mask and no masked_fill are faster."""
        if self._mask_inputs is None or self._mask_inputs[0] is not mask:
            allowed = dead = None
            if not mask.all():
                # a (1, 1, T, S) mask: SDPA's CPU kernel is ~30% slower with the 2-D form
                allowed = self._tensor(mask).to(self.torch_device)[None, None]
                no_cell = ~mask.any(-1)
                if no_cell.any():
                    dead = self._tensor(no_cell).to(self.torch_device)[None, :, None]
            self._mask_inputs = (mask, (allowed, dead))
        return self._mask_inputs[1]

    def _rows_tensors(self, kv_rows: Any) -> dict[str, Any]:
        """Index and mask tensors of one :class:`~tessera.engine.kv_cache.KVRows`, made once per
        ubatch (every layer of the forward pass reuses them)."""
        if self._rows_inputs is not None and self._rows_inputs[0] is kv_rows:
            return self._rows_inputs[1]
        rows = kv_rows.rows
        n_slices, n_rows = rows.shape
        allowed = kv_rows.allowed()
        q_rows, no_row = np.maximum(kv_rows.q_rows, 0).ravel(), ~allowed.any(-1)
        identity = np.arange(len(kv_rows.q_index))
        # One sequence's queries over exactly their own rows in order (a prompt into an
        # empty cache): SDPA's causal kernel, which skips the masked half, needs no mask.
        causal = n_slices == 1 and n_rows == kv_rows.q_rows.shape[1] > 1
        causal = causal and np.array_equal(allowed[0], np.tri(n_rows, dtype=bool))
        # None where a step can be skipped (one token decoding over its whole sequence:
        # every row allowed, no query without rows, queries already in order)
        t: dict[str, Any] = {
            "q": None if np.array_equal(q_rows, identity) else self._index(q_rows),
            "out": None
            if q_rows.size == len(identity) and np.array_equal(kv_rows.q_index, identity)
            else self._index(kv_rows.q_index),
            "causal": causal,
            # (S, 1, Tq, R), additive: SDPA would convert a boolean mask in every layer
            "mask": None if causal or allowed.all() else self._additive_mask(allowed)[:, None],
            "dead": self._tensor(no_row).to(self.torch_device)[:, None, :, None]
            if no_row.any()
            else None,
            "pad": None,
            "span": None,
        }
        if self._native() is not None and len(kv_rows.q_index) <= NATIVE_ATTENTION_QUERIES:
            t["native"] = RowLists(rows, kv_rows.q_rows, None if allowed.all() else allowed)
        if n_slices == 1 and np.array_equal(rows[0], np.arange(rows[0, 0], rows[0, 0] + n_rows)):
            t["span"] = (int(rows[0, 0]), n_rows)  # one sequence in one run: a view, no gather
        else:
            t["cells"] = self._index(np.maximum(rows, 0).ravel())
            if kv_rows.padded:
                t["pad"] = self._tensor(rows < 0).to(self.torch_device)[..., None, None]
        self._rows_inputs = (kv_rows, t)
        return t

    def _additive_mask(self, allowed: np.ndarray) -> torch.Tensor:
        """``allowed`` as 0 / -inf in the compute dtype, on the device."""
        blocked = self._tensor(~allowed).to(self.torch_device)
        zeros = torch.zeros(blocked.shape, dtype=self.torch_dtype, device=self.torch_device)
        return zeros.masked_fill_(blocked, float("-inf"))

    def attention_rows(self, q, k_cache, v_cache, kv_rows, scale):
        n_tokens, n_head, dim = q.shape
        n_head_kv = k_cache.shape[1]
        n_slices, n_q = kv_rows.q_rows.shape
        n_rows = kv_rows.rows.shape[1]
        t = self._rows_tensors(kv_rows)
        lists = t.get("native")
        if lists is not None and q.dtype == k_cache.dtype == v_cache.dtype:
            if k_cache.is_contiguous() and v_cache.is_contiguous():
                # decode: one C call reads each query's rows in place (no gather, no mask)
                return self._native().attention_rows(q, k_cache, v_cache, lists, scale)
        if t["span"] is not None:
            start, length = t["span"]
            k, v = k_cache[start : start + length][None], v_cache[start : start + length][None]
        else:
            k = k_cache.index_select(0, t["cells"]).view(n_slices, n_rows, n_head_kv, -1)
            v = v_cache.index_select(0, t["cells"]).view(n_slices, n_rows, n_head_kv, -1)
            if t["pad"] is not None:  # padding rows read nothing (a -inf mask entry)
                k, v = k.masked_fill(t["pad"], 0.0), v.masked_fill(t["pad"], 0.0)
        qs = q if t["q"] is None else q.index_select(0, t["q"])
        qs = qs.view(n_slices, n_q, n_head, dim)
        # (S, H, Tq|R, D): one batched SDPA over all slices; GQA without copying K/V.
        out = F.scaled_dot_product_attention(
            qs.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=t["mask"],
            is_causal=t["causal"],
            scale=scale,
            enable_gqa=n_head != n_head_kv,
        )
        if t["dead"] is not None:
            out = out.masked_fill(t["dead"], 0.0)  # a query with no allowed row gives zeros
        out = out.transpose(1, 2).reshape(n_slices * n_q, -1)
        out = out if t["out"] is None else out.index_select(0, t["out"])
        return out.reshape(n_tokens, -1)

    def decoder_block(self, x, block, k_cache, v_cache, cell, kv_rows, positions):
        return torch_block.decoder_block(self, x, block, k_cache, v_cache, cell, kv_rows, positions)

    def moe_ffn(self, x, expert_ids, expert_weights, experts):
        from tessera.backends.torch.moe import moe_ffn

        return moe_ffn(self, x, expert_ids, expert_weights, experts)

    def set_rows(self, dst: torch.Tensor, rows: np.ndarray, src: torch.Tensor) -> None:
        with _writable(dst):
            if len(rows) == 1:  # decode: one cell, a view copy (no index tensor)
                dst[int(rows[0])].copy_(src[0])
            else:
                dst.index_copy_(0, self._index(rows), src.to(dst.dtype))

    # -- batched transfers -----------------------------------------------------------

    def set_n(self, dsts, rows_list, srcs) -> None:
        """One host-to-device transfer for the whole list, then one ``_foreach_copy_``."""
        rows_list = rows_list if rows_list is not None else [None] * len(dsts)
        hosts = [self._tensor(np.asarray(s)) for s in srcs]
        if self.torch_device.type != "cpu" and hosts:
            staging = torch.cat([h.reshape(-1).to(self.torch_dtype) for h in hosts])
            moved = staging.to(self.torch_device).split([h.numel() for h in hosts])
            hosts = [m.view(h.shape) for m, h in zip(moved, hosts, strict=True)]
        dst_views, src_views = [], []
        for dst, rows, src in zip(dsts, rows_list, hosts, strict=True):
            span = _span(rows, len(dst))
            if span is None:  # scattered cells: an index copy of their own
                self.set_rows(dst, rows, src)
            else:
                dst_views.append(dst[span[0] : span[1]])
                src_views.append(src)
        if dst_views:
            with _writable(dst_views[0]):
                torch._foreach_copy_(dst_views, src_views)

    def get_n(self, tensors, rows_list=None) -> list[np.ndarray]:
        """Gather every tensor's rows into one staging buffer, read back in one transfer."""
        rows_list = rows_list if rows_list is not None else [None] * len(tensors)
        parts = []
        for t, rows in zip(tensors, rows_list, strict=True):
            span = _span(rows, len(t))
            parts.append(t[span[0] : span[1]] if span else t.index_select(0, self._index(rows)))
        if not parts or len({p.dtype for p in parts}) > 1 or not parts[0].is_floating_point():
            return super().get_n(tensors, rows_list)
        sizes = [p.numel() for p in parts]
        if self.torch_device.type == "cpu":
            # straight into one float32 host buffer: one copy, with the dtype conversion
            host = np.empty(sum(sizes), dtype=np.float32)
            views = list(torch.from_numpy(host).split(sizes))
            torch._foreach_copy_(views, [p.reshape(-1) for p in parts])
        else:
            host = torch.cat([p.reshape(-1) for p in parts]).float().cpu().numpy()
        offsets = np.cumsum(sizes)[:-1]
        return [a.reshape(p.shape) for a, p in zip(np.split(host, offsets), parts, strict=True)]

    def copy_n(self, dsts, srcs) -> None:
        """``dsts[i][...] = srcs[i]`` for the whole list in one ``_foreach_copy_``."""
        if dsts:
            with _writable(dsts[0]):
                torch._foreach_copy_(list(dsts), list(srcs))

    def forward_scope(self) -> Any:
        """``torch.inference_mode()``: no autograd bookkeeping per op (1-5% of a one-sentence
        BERT forward); ``TESSERA_TORCH_INFERENCE_MODE=0`` turns it off."""
        if os.environ.get(INFERENCE_MODE_ENV, "").strip() == "0":
            return contextlib.nullcontext()
        return torch.inference_mode()


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, neox: bool
) -> torch.Tensor:
    """RoPE's rotation of the first ``n_rot`` values of each head of ``x`` by the angle
    tables ``cos``/``sin`` (broadcast against ``(..., n_rot / 2)``): pairs ``(j, j +
    n_rot/2)`` when ``neox``, else ``(2j, 2j + 1)``; eager ops, each rounded to x's dtype."""
    half = n_rot // 2
    rot, rest = x[..., :n_rot], x[..., n_rot:]
    if neox:
        a, b = rot[..., :half], rot[..., half:]
        rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    else:
        pairs = rot.unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


#: RoPE inputs smaller than this (decode, a few rows) run the native kernel where its probe
#: passes (bf16/f16 on a VNNI CPU; ``TESSERA_NATIVE_DISABLE=1`` turns it off); larger ones
#: stay on torch's ops, which use every thread. (RMSNorm runs natively at every size: its
#: kernel splits rows over the threads.)
NATIVE_SMALL_OP_VALUES = 1 << 16
#: Weights per native matmul_n call (tessera.backends.native.kernels.MAX_WEIGHTS).
MAX_NATIVE_WEIGHTS = 8


def _no_native(n_rows: int) -> None:
    """``native_gemv`` of weights without a native kernel (plain tensors, other types)."""
    return None


#: attention_rows runs natively for ubatches of at most this many queries (decode, small
#: batches of sequences); larger ubatches keep SDPA's blocked kernels.
NATIVE_ATTENTION_QUERIES = 16

#: ``0``: forward passes run outside ``torch.inference_mode()`` (see forward_scope).
INFERENCE_MODE_ENV = "TESSERA_TORCH_INFERENCE_MODE"

#: ``0`` turns the fused RMSNorm kernel off (the op is then composed of elementwise ops).
FUSED_NORM_ENV = "TESSERA_TORCH_FUSED_NORM"


def fused_rms_norm_ok(backend: TorchBackend) -> bool:
    """Probe for ``F.rms_norm``: present in this torch, not switched off, and equal to the
    composed ops on a small input on this device (float32 statistics either way)."""
    if os.environ.get(FUSED_NORM_ENV, "").strip() == "0" or not hasattr(F, "rms_norm"):
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 96, generator=gen).to(backend.torch_device, backend.torch_dtype)
    w = torch.rand(96, generator=gen).to(backend.torch_device, backend.torch_dtype) + 0.5
    try:
        got = F.rms_norm(x.float(), (96,), w.float(), 1e-6).to(x.dtype)
    except RuntimeError:
        return False
    return bool(torch.allclose(got.float(), backend._rms_norm_ops(x, w, 1e-6).float(), 1e-2))


def _span(rows: np.ndarray | None, n: int) -> tuple[int, int] | None:
    """``(start, stop)`` when ``rows`` is None (all ``n`` rows) or one ascending run."""
    if rows is None:
        return 0, n
    rows = np.asarray(rows)
    if len(rows) == 0:
        return 0, 0
    start = int(rows[0])
    return (
        (start, start + len(rows))
        if np.array_equal(rows, np.arange(start, start + len(rows)))
        else None
    )


def _writable(dst: torch.Tensor) -> Any:
    """Inference mode for writing into a cache made inside it; nothing otherwise."""
    if dst.is_inference() and not torch.is_inference_mode_enabled():
        return torch.inference_mode()
    return contextlib.nullcontext()

"""The torch backend's attention: ``attention`` over a dense mask and ``attention_rows`` over
a ubatch's KV row lists, both on SDPA (``attention_rows`` of a few queries on the native
kernel), and ``attention_softcap`` (capped scores, sinks) on plain matmuls, with the mask
and index tensors made once per ubatch and reused by every layer."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tessera.backends.native.kernels import RowLists
from tessera.backends.torch.activations import to_dtype
from tessera.backends.torch.kv_store import Q8_0Rows, cache_type_of, read_rows

#: attention_rows runs natively for ubatches of at most this many queries (decode, small
#: batches of sequences); larger ubatches keep SDPA's blocked kernels.
NATIVE_ATTENTION_QUERIES = 16


class AttentionOps:
    """The attention ops of :class:`~tessera.backends.torch.ops.TorchBackend` (a mixin: its
    per-ubatch ``_mask_inputs`` and ``_rows_inputs`` are set up in ``TorchBackend.__init__``)."""

    def attention(self, q, k_cache, v_cache, n_kv, mask, scale):
        # SDPA multiplies in attn_dtype: float32 activations' q is rounded to it
        q_dtype, q = q.dtype, to_dtype(q, self.attn_dtype)
        n_tokens, n_head, _ = q.shape
        n_head_kv = k_cache.shape[1]
        allowed, dead = self._mask_tensors(mask)
        k, v = _cells(k_cache, n_kv, q.dtype), _cells(v_cache, n_kv, q.dtype)
        # (1, H, T, D) views; GQA without copying K/V. With a batch axis SDPA takes its
        # fused CPU kernel (3-D inputs fall back to the slow unfused path: 5-8x slower).
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=allowed,
            scale=scale,
            enable_gqa=n_head != n_head_kv,
        )[0]
        if dead is not None:
            # A query with no allowed cell must give zeros; some SDPA kernels give NaN there.
            out = out.masked_fill(dead, 0.0)
        return to_dtype(out.transpose(0, 1).reshape(n_tokens, -1), q_dtype)

    def attention_softcap(self, q, k_cache, v_cache, n_kv, mask, scale, softcap, sinks=None):
        # SDPA can neither cap scores nor add sinks, so the scores are made explicitly:
        # (Hkv, group * T, S) matmuls give GQA without copying K/V.
        q_dtype, q = q.dtype, to_dtype(q, self.attn_dtype)
        n_tokens, n_head, _ = q.shape
        n_head_kv = k_cache.shape[1]
        allowed, dead = self._mask_tensors(mask)
        k = _cells(k_cache, n_kv, q.dtype).transpose(0, 1)  # (Hkv, S, D)
        v = _cells(v_cache, n_kv, q.dtype).transpose(0, 1)
        qg = q.transpose(0, 1).reshape(n_head_kv, -1, q.shape[-1])  # (Hkv, group * T, D)
        scores = torch.matmul(qg, k.transpose(1, 2)).float().view(n_head, n_tokens, -1) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        if allowed is not None:
            scores = scores.masked_fill(~allowed[0], float("-inf"))
        if sinks is None:
            weights = torch.softmax(scores, dim=-1).to(v.dtype)
        else:  # the sink is one more logit per head, whose weight is dropped
            sink = sinks.float().view(n_head, 1, 1).expand(n_head, n_tokens, 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
            weights = weights[..., :n_kv].contiguous().to(v.dtype)
        out = torch.matmul(weights.view(n_head_kv, -1, n_kv), v).view(n_head, n_tokens, -1)
        if dead is not None:
            out = out.masked_fill(dead, 0.0)  # softmax over no cell gives NaN: zeros instead
        return to_dtype(out.transpose(0, 1).reshape(n_tokens, -1), q_dtype)

    def _native_attention(self, q, k_cache, v_cache, lists, scale) -> Any:
        """The native kernel's attention over the caches in place, or None where it does not
        read them (a view that is not contiguous, such as a V inside K)."""
        native = self._native()
        caches = [c.blocks if isinstance(c, Q8_0Rows) else c for c in (k_cache, v_cache)]
        if not all(c.is_contiguous() for c in caches):
            return None
        kinds = [cache_type_of(c) for c in (k_cache, v_cache)]
        if q.dtype == caches[0].dtype == caches[1].dtype:
            return native.attention_rows(q, k_cache, v_cache, lists, scale)
        return native.attention_kv(q, caches[0], kinds[0], caches[1], kinds[1], v_cache.shape,
                                   lists, scale)  # fmt: skip

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
        """Index and mask tensors of one :class:`~tessera.engine.kv_view.KVRows`, made once per
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
        """``allowed`` as 0 / -inf in SDPA's dtype, on the device."""
        blocked = self._tensor(~allowed).to(self.torch_device)
        zeros = torch.zeros(blocked.shape, dtype=self.attn_dtype, device=self.torch_device)
        return zeros.masked_fill_(blocked, float("-inf"))

    def attention_rows(self, q, k_cache, v_cache, kv_rows, scale):
        n_tokens, n_head, dim = q.shape
        n_head_kv = k_cache.shape[1]
        n_slices, n_q = kv_rows.q_rows.shape
        n_rows = kv_rows.rows.shape[1]
        t = self._rows_tensors(kv_rows)
        lists = t.get("native")
        if lists is not None:
            # decode: one C call reads each query's rows in place (no gather, no mask)
            out = self._native_attention(q, k_cache, v_cache, lists, scale)
            if out is not None:
                return out
        q_dtype, q = q.dtype, to_dtype(q, self.attn_dtype)  # SDPA's inputs: compute dtype
        if t["span"] is not None:
            span = slice(t["span"][0], t["span"][0] + t["span"][1])
            k, v = (read_rows(c, span, q.dtype)[None] for c in (k_cache, v_cache))
        else:
            k, v = (
                read_rows(c, t["cells"], q.dtype).view(n_slices, n_rows, n_head_kv, -1)
                for c in (k_cache, v_cache)
            )
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
        return to_dtype(out.reshape(n_tokens, -1), q_dtype)


def _cells(cache: Any, n_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """Cells ``[0, n_kv)`` of a cache in ``dtype``: a view of a cache in that dtype, else the
    stored values converted."""
    if isinstance(cache, torch.Tensor) and cache.dtype == dtype:
        return cache[:n_kv]
    return read_rows(cache, slice(0, n_kv), dtype)

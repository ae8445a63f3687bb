"""The torch backend's row writes and batched transfers: ``set_rows`` and ``set_n`` /
``get_n`` / ``copy_n``, each list moved in as few transfers and copies as possible."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch

from tessera.backends.torch.kv_store import Q8_0Rows


class TransferOps:
    """The row writes and batched transfers of :class:`~tessera.backends.torch.ops.TorchBackend`
    (a mixin)."""

    def set_rows(self, dst: Any, rows: np.ndarray, src: torch.Tensor) -> None:
        if isinstance(dst, Q8_0Rows):  # a q8_0 KV cache: the rows quantized into its blocks
            with _writable(dst.blocks):
                dst.write(int(rows[0]) if len(rows) == 1 else self._index(rows), src)
            return
        with _writable(dst):
            if len(rows) == 1:  # decode: one cell, a view copy (no index tensor)
                dst[int(rows[0])].copy_(src[0])
            else:
                dst.index_copy_(0, self._index(rows), src.to(dst.dtype))

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
            if isinstance(dst, Q8_0Rows):  # quantized on the way in
                self.set_rows(dst, np.arange(*span) if span else rows, src.to(self.torch_device))
            elif span is None:  # scattered cells: an index copy of their own
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
            if isinstance(t, Q8_0Rows):  # a q8_0 KV cache: its values in float32
                index = slice(*span) if span else self._index(rows)
                parts.append(t.values(index, torch.float32))
                continue
            parts.append(t[span[0] : span[1]] if span else t.index_select(0, self._index(rows)))
        if not parts or not all(p.is_floating_point() for p in parts):
            return super().get_n(tensors, rows_list)
        if len({p.dtype for p in parts}) > 1:  # caches of several types: all as float32
            parts = [p.float() for p in parts]
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
        if any(isinstance(d, Q8_0Rows) for d in dsts):  # q8_0 caches: through set_rows
            for dst, src in zip(dsts, srcs, strict=True):
                self.set_rows(dst, np.arange(len(dst)), src)
            return
        if dsts:
            with _writable(dsts[0]):
                torch._foreach_copy_(list(dsts), list(srcs))


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

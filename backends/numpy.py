"""The numpy reference backend: float32 everywhere, every op written as plainly as possible.

Every other backend is tested against this one. It favours obviousness over speed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tessera.contract.backend import CORE_OPS, Backend, BackendInfo
from tessera.contract.ops import Op
from tessera.contract.recurrent_ops import (
    gated_delta_net_reference,
    sigmoid_reference,
    ssm_conv_reference,
)
from tessera.engine.kv_types import KV_TYPE_BYTES, stored_values
from tessera.errors import UnknownBackendError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


class NumpyBackend(Backend):
    name = "numpy"
    device = "cpu"
    dtype = "f32"

    def supports(self, op: Op) -> bool:
        # attention_rows is implemented as a reference but declined: numpy contexts always
        # run the dense-mask fallback, so that path stays exercised by every numpy test.
        return (
            op.name in CORE_OPS
            or op.name
            in (
                "attention_softcap",
                "rope_ext",
                "tanh",
                "swiglu_oai",
                "gelu_erf",
                "moe_ffn",
                "linear",
                "concat",
                "matmul_heads",
                "sigmoid",
                "ssm_conv",
                "gated_delta_net",
            )
            or (op.name == "kv_cache" and op.get("type") in KV_TYPE_BYTES)
        )

    def from_numpy(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return a.astype(np.float32) if a.dtype.kind == "f" else a.copy()

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float32)

    def zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    def kv_cache(self, shape: tuple[int, ...], cache_type: str) -> np.ndarray:
        """float32 values that :meth:`set_rows` rounds as ``cache_type`` stores them."""
        return StoredRows(shape, cache_type)

    def load_weight(self, raw: Any, qtype: Any) -> np.ndarray:
        self.record(raw.name, "dequantize", f"{qtype.name} decoded to f32 (reference backend)")
        return qtype.dequantize_tensor(raw.data, raw.shape)

    def matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x @ w.T

    def matmul_heads(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.einsum("thk,hnk->thn", x, w)

    def concat(self, xs: Any) -> np.ndarray:
        return np.concatenate(list(xs), axis=-1)

    def get_rows(self, w: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return w[np.asarray(ids)]

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a * b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        return y if weight is None else y * weight

    def layer_norm(self, x, weight, bias, eps):
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        y = (x - mean) / np.sqrt(var + eps)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y

    def rope(self, x, positions, n_rot, freq_base, neox, freq_scale=1.0):
        return self.rope_ext(x, positions, n_rot, freq_base, neox, freq_scale, None)

    def rope_ext(self, x, positions, n_rot, freq_base, neox, freq_scale, freq_factors, mscale=1.0):
        half = n_rot // 2
        inv_freq = freq_base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
        if freq_factors is not None:
            inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
        angle = np.asarray(positions, dtype=np.float64)[:, None] * freq_scale * inv_freq
        cos = (np.cos(angle) * mscale).astype(np.float32)[:, None, :]  # (T, 1, half)
        sin = (np.sin(angle) * mscale).astype(np.float32)[:, None, :]
        out = x.copy()
        if neox:
            a, b = x[..., :half], x[..., half:n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:n_rot] = a * sin + b * cos
        else:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = a * cos - b * sin
            out[..., 1:n_rot:2] = a * sin + b * cos
        return out

    def silu(self, x):
        return x / (1.0 + np.exp(-x))

    def gelu(self, x):
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))

    def swiglu(self, gate, up):
        return self.silu(gate) * up

    def swiglu_oai(self, gate, up, alpha, limit):
        g = np.minimum(gate, np.float32(limit))
        u = np.clip(up, np.float32(-limit), np.float32(limit))
        with np.errstate(over="ignore"):  # exp overflows to inf for very negative g: glu 0
            glu = g / (np.float32(1.0) + np.exp(np.float32(-alpha) * g))
        return (glu * (u + np.float32(1.0))).astype(np.float32)

    def sigmoid(self, x):
        return sigmoid_reference(x)

    def ssm_conv(self, x, state, weight):
        return ssm_conv_reference(x, state, weight)

    def gated_delta_net(self, q, k, v, g, beta, state):
        return gated_delta_net_reference(q, k, v, g, beta, state)

    def tanh(self, x):
        return np.tanh(x)

    def linear(self, x, w, bias, activation="", residual=None):
        y = self.matmul(x, w) + bias
        if activation:
            y = {"gelu": self.gelu, "gelu_erf": self.gelu_erf}[activation](y)
        return y if residual is None else y + residual

    def gelu_erf(self, x):
        erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; exact in f64
        return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(np.float32)

    def attention(self, q, k_cache, v_cache, n_kv, mask, scale):
        return self.attention_softcap(q, k_cache, v_cache, n_kv, mask, scale, 0.0)

    def attention_softcap(self, q, k_cache, v_cache, n_kv, mask, scale, softcap, sinks=None):
        """Dense attention; with ``softcap > 0`` each score ``s`` is ``softcap * tanh(s /
        softcap)`` before masking, and ``sinks`` (one logit per head) join each softmax's
        denominator (plain :meth:`attention` is the case of neither)."""
        n_tokens, n_head, _ = q.shape
        n_head_kv = k_cache.shape[1]
        group = n_head // n_head_kv
        k = np.repeat(k_cache[:n_kv], group, axis=1)  # (n_kv, Hq, D)
        v = np.repeat(v_cache[:n_kv], group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) * np.float32(scale)
        if softcap:
            scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
        scores = np.where(mask[None], scores, -np.inf)
        peak = scores.max(axis=-1, keepdims=True)
        if sinks is not None:
            sink = np.asarray(sinks, np.float32).reshape(n_head, 1, 1)
            peak = np.maximum(peak, sink)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sink - peak)  # the sink's share has no value
        weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
        out = np.einsum("hts,shd->thd", weights, v)
        return out.reshape(n_tokens, -1).astype(np.float32)

    def attention_rows(self, q, k_cache, v_cache, kv_rows, scale):
        """The reference for other backends' ``attention_rows`` (the conformance kit's oracle).

        The probe still declines the op (see :meth:`supports`), so contexts on this backend
        take the dense-mask path: the fallback the runtime must always have.
        """
        n_tokens, n_head, _ = q.shape
        group = n_head // k_cache.shape[1]
        real = kv_rows.rows >= 0
        cells = np.where(real, kv_rows.rows, 0)
        # Padding rows read nothing: zeros instead of whatever cell 0 holds.
        k = np.where(real[..., None, None], k_cache[cells], 0.0)  # (S, R, Hkv, D)
        v = np.where(real[..., None, None], v_cache[cells], 0.0)
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
        qs = q[np.where(kv_rows.q_rows >= 0, kv_rows.q_rows, 0)]  # (S, Tq, Hq, D)
        scores = np.einsum("sthd,srhd->shtr", qs, k) * np.float32(scale)
        scores = np.where(kv_rows.allowed()[:, None], scores, -np.inf)
        peak = scores.max(axis=-1, keepdims=True)
        peak = np.where(np.isfinite(peak), peak, 0.0)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True)
        weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
        out = np.einsum("shtr,srhd->sthd", weights, v)  # (S, Tq, Hq, Dv)
        out = out.reshape(-1, n_head * v.shape[-1])[kv_rows.q_index]
        return out.reshape(n_tokens, -1).astype(np.float32)

    def moe_ffn(self, x, expert_ids, expert_weights, experts):
        """The reference routed experts: each selected expert runs on its own rows only."""
        out = np.zeros_like(x, dtype=np.float32)
        used = np.unique(expert_ids)
        for e, (gate, up, down) in zip(used, experts.get(used.tolist()), strict=True):
            rows, slot = np.nonzero(expert_ids == e)  # a row picks an expert at most once
            h = x[rows]
            y = self.swiglu(h @ gate.T, h @ up.T) @ down.T
            out[rows] += y * expert_weights[rows, slot][:, None]
        return out

    def set_rows(self, dst, rows, src):
        kind = getattr(dst, "cache_type", None)
        dst[np.asarray(rows)] = src if kind is None else stored_values(src, kind)


class StoredRows(np.ndarray):
    """A KV cache of another type than float32: its values are float32, rounded as
    ``cache_type`` stores them when written (its views and results carry no type)."""

    def __new__(cls, shape: tuple[int, ...], cache_type: str) -> StoredRows:
        rows = np.zeros(shape, dtype=np.float32).view(cls)
        rows.cache_type = cache_type
        return rows


def create(device: str | None = None, dtype: str | None = None) -> NumpyBackend:
    if device not in (None, "cpu") or dtype not in (None, "f32"):
        raise UnknownBackendError(
            f"the numpy backend runs only on the cpu in f32 (asked for device={device!r}, "
            f"dtype={dtype!r}); use --backend torch for other devices or dtypes"
        )
    return NumpyBackend()


@hookimpl
def tessera_register_backends(register):
    register(BackendInfo("numpy", create, "float32 reference, every op"))

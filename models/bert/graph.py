"""The forward pass of the ``bert`` architecture (see :mod:`tessera.models.bert.arch`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.contract.ops import Op
from tessera.engine.pooling import SequenceAttention
from tessera.errors import TesseraError
from tessera.switches import OFF, ON, Switch, choose

if TYPE_CHECKING:
    from tessera.models.bert.arch import BertConfig

FUSED_LINEAR_DISABLE = Switch(
    "TESSERA_FUSED_LINEAR_DISABLE",
    "BERT dense layers as matmul then add instead of the backend's fused linear op",
    OFF,
)
FUSED_QKV = Switch(
    "TESSERA_BERT_FUSED_QKV",
    "BERT Q/K/V as one dense layer over their concatenated weights; 0: three layers",
    ON,
    default=True,
)


class BertGraph:
    """The encoder forward pass on one backend: hidden states, never logits."""

    def __init__(self, config: BertConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = config
        self.w = weights
        self.b = backend
        self.attn_scale = 1.0 / math.sqrt(config.head_dim)
        linear = backend.supports(Op("linear", dtype=backend.dtype))
        why = "backend supports linear" if linear else "backend declines linear"
        dense = choose(FUSED_LINEAR_DISABLE, (linear, why), on="linear", off="matmul + add")
        self.fused = dense.path == "linear"
        backend.record("bert dense layers", *dense)
        self.qkv = self._fuse_qkv()
        if "token_types.weight" in weights:
            self.type0 = backend.get_rows(weights["token_types.weight"], np.zeros(1, np.int32))
        exact = config.gelu_exact and backend.supports(Op("gelu_erf", dtype=backend.dtype))
        self.gelu = backend.gelu_erf if exact else backend.gelu
        self.gelu_name = "gelu_erf" if exact else "gelu"
        # the FFN's GELU inside the up projection's linear op, where the backend takes it
        fused_gelu = Op("linear", {"activation": self.gelu_name}, backend.dtype)
        self.fused_gelu = self.fused and backend.supports(fused_gelu)
        if config.gelu_exact:
            backend.record(
                "bert gelu",
                "gelu_erf" if exact else "gelu (tanh)",
                "backend supports gelu_erf" if exact else "backend declines gelu_erf",
            )

    def _fuse_qkv(self) -> list[tuple[Any, Any]] | None:
        """Per layer, Q/K/V weights and biases concatenated into one ``(3 n_embd, n_embd)``
        dense layer, made once here: one call instead of three per layer (each backend
        call has a fixed cost that dominates with few rows). None where the dense layers
        do not run as ``linear``, a weight is not a plain array (a quantized weight
        kernel), or ``TESSERA_BERT_FUSED_QKV=0``."""
        b = self.b
        plain = type(b.from_numpy(np.zeros(1, np.float32)))
        names = [
            f"blk.{il}.attn_{x}.{part}"
            for il in range(self.c.n_layer)
            for part in ("weight", "bias")
            for x in "qkv"
        ]

        def probe() -> tuple[bool, str]:
            if not self.fused:
                return False, "dense layers run as matmul + add"
            if not all(isinstance(self.w[n], plain) for n in names):
                return False, "q/k/v weights are not plain arrays (a weight kernel)"
            return True, "q/k/v weights concatenated at load"

        qkv = choose(FUSED_QKV, probe, on="one fused dense layer", off="three dense layers")
        b.record("bert q/k/v", *qkv)
        if qkv.path != "one fused dense layer":
            return None
        fused = []
        for il in range(self.c.n_layer):
            p = f"blk.{il}.attn_"
            w = np.concatenate([b.to_numpy(self.w[p + x + ".weight"]) for x in "qkv"])
            bias = np.concatenate([b.to_numpy(self.w[p + x + ".bias"]) for x in "qkv"])
            fused.append((b.from_numpy(w), b.from_numpy(bias)))
        return fused

    def _dense(self, x: Any, name: str, gelu: bool = False, residual: Any = None) -> Any:
        """``gelu(x @ w.T + bias) + residual`` (each part optional), in one backend op
        where it takes them."""
        b = self.b
        w, bias = self.w[name + ".weight"], self.w[name + ".bias"]
        if self.fused and (self.fused_gelu or not gelu):
            return b.linear(x, w, bias, self.gelu_name if gelu else "", residual)
        y = b.linear(x, w, bias) if self.fused else b.add(b.matmul(x, w), bias)
        y = self.gelu(y) if gelu else y
        return y if residual is None else b.add(y, residual)

    def _norm(self, x: Any, name: str) -> Any:
        return self.b.layer_norm(
            x, self.w[name + ".weight"], self.w[name + ".bias"], self.c.norm_eps
        )

    def _embed(self, inp: ForwardInput) -> Any:
        b, w = self.b, self.w
        if int(inp.positions.max()) >= self.c.n_ctx_train:
            raise TesseraError(
                f"position {int(inp.positions.max())} is past this BERT model's "
                f"{self.c.n_ctx_train} learned positions; shorten the input"
            )
        x = b.add(
            b.get_rows(w["token_embd.weight"], inp.tokens),
            b.get_rows(w["position_embd.weight"], inp.positions),
        )
        if "token_types.weight" in w:
            if inp.token_types is None:  # every row segment 0: one row, broadcast
                x = b.add(x, self.type0)
            else:
                x = b.add(x, b.get_rows(w["token_types.weight"], inp.token_types))
        return self._norm(x, "token_embd_norm")

    def forward(self, inp: ForwardInput) -> Any:
        if not inp.embeddings:
            raise TesseraError(
                "this is a BERT encoder: it has no LM head and cannot generate; use it for "
                "embeddings or reranking (tessera embed / tessera rerank)"
            )
        b, c = self.b, self.c
        n = len(inp.tokens)
        attention = inp.kv
        if attention is None:  # one sequence, dense path
            seq_ids = np.zeros(n, np.int32) if inp.seq_ids is None else inp.seq_ids
            attention = SequenceAttention(seq_ids, "dense")
        x = self._embed(inp)
        all_rows = len(inp.output_rows) == n
        for il in range(c.n_layer):
            p = f"blk.{il}."
            if self.qkv is not None:
                y = b.linear(x, *self.qkv[il]).reshape(n, 3, c.n_head, c.head_dim)
                q, k, v = y[:, 0], y[:, 1], y[:, 2]
            else:
                q = self._dense(x, p + "attn_q").reshape(n, c.n_head, c.head_dim)
                k = self._dense(x, p + "attn_k").reshape(n, c.n_head, c.head_dim)
                v = self._dense(x, p + "attn_v").reshape(n, c.n_head, c.head_dim)
            attn = attention.attend(b, q, k, v, self.attn_scale)
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows the pooling reads go through the last dense layers.
                attn = b.get_rows(attn, inp.output_rows)
                x = b.get_rows(x, inp.output_rows)
            x = self._norm(self._dense(attn, p + "attn_output", residual=x), p + "attn_output_norm")
            h = self._dense(x, p + "ffn_up", gelu=True)
            x = self._norm(self._dense(h, p + "ffn_down", residual=x), p + "layer_output_norm")
        return x

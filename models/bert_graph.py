"""The forward pass of the ``bert`` architecture (see :mod:`tessera.models.bert`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from tessera.arch import ForwardInput
from tessera.errors import TesseraError
from tessera.pooling import SequenceAttention

if TYPE_CHECKING:
    from tessera.models.bert import BertConfig

#: Set (to anything but "" or "0") to run dense layers as matmul + add, for comparison.
FUSED_LINEAR_DISABLE_ENV = "TESSERA_FUSED_LINEAR_DISABLE"


class BertGraph:
    """The encoder forward pass on one backend: hidden states, never logits."""

    def __init__(self, config: BertConfig, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = config
        self.w = weights
        self.b = backend
        self.attn_scale = 1.0 / math.sqrt(config.head_dim)
        self.fused = backend.supports("linear") and os.environ.get(
            FUSED_LINEAR_DISABLE_ENV, ""
        ) in ("", "0")
        backend.record(
            "bert dense layers",
            "linear" if self.fused else "matmul + add",
            "backend supports linear"
            if self.fused
            else f"{FUSED_LINEAR_DISABLE_ENV} set"
            if backend.supports("linear")
            else "backend declines linear",
        )
        exact = config.gelu_exact and backend.supports("gelu_erf")
        self.gelu = backend.gelu_erf if exact else backend.gelu
        if config.gelu_exact:
            backend.record(
                "bert gelu",
                "gelu_erf" if exact else "gelu (tanh)",
                "backend supports gelu_erf" if exact else "backend declines gelu_erf",
            )

    def _dense(self, x: Any, name: str) -> Any:
        w, bias = self.w[name + ".weight"], self.w[name + ".bias"]
        if self.fused:
            return self.b.linear(x, w, bias)
        return self.b.add(self.b.matmul(x, w), bias)

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
            types = inp.token_types
            types = np.zeros(len(inp.tokens), np.int32) if types is None else types
            x = b.add(x, b.get_rows(w["token_types.weight"], types))
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
            q = self._dense(x, p + "attn_q").reshape(n, c.n_head, c.head_dim)
            k = self._dense(x, p + "attn_k").reshape(n, c.n_head, c.head_dim)
            v = self._dense(x, p + "attn_v").reshape(n, c.n_head, c.head_dim)
            attn = self._dense(attention.attend(b, q, k, v, self.attn_scale), p + "attn_output")
            if il == c.n_layer - 1 and not all_rows:
                # Only the rows the pooling reads go through the last FFN.
                attn = b.get_rows(attn, inp.output_rows)
                x = b.get_rows(x, inp.output_rows)
            x = self._norm(b.add(x, attn), p + "attn_output_norm")
            h = self._dense(self.gelu(self._dense(x, p + "ffn_up")), p + "ffn_down")
            x = self._norm(b.add(x, h), p + "layer_output_norm")
        return x

"""The Gemma 4 forward pass on one backend, with prefill pruning before the KV-shared layers.

Pruning: a KV-shared layer writes no KV, so what it computes for a row matters only if that
row's output is wanted. When the context allows it (``ForwardInput.prune_ok``: one
sequence, no embeddings, no intermediate outputs, unified KV) and some rows need no output,
the hidden states, per-layer inputs, positions and the KV view are cut down to the output
rows just before the first KV-shared layer, so the upper layers of a 512-token prefill run
on one row. Without KV-shared layers, or when not allowed, every row runs through every
layer and only the last layer's FFN and the head are limited to the output rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import ForwardInput


class Gemma4Graph:
    """The forward pass of one Gemma 4 model (see :mod:`tessera.models.gemma4.arch`)."""

    def __init__(self, config: Any, weights: Mapping[str, Any], backend: Any) -> None:
        self.c = c = config
        self.w = weights
        self.b = backend
        self.output = weights.get("output.weight", weights["token_embd.weight"])
        self.sources = c.kv_sources()
        self.rope_factors = None
        if "rope_freqs.weight" in weights:  # host data for rope_ext, read once
            self.rope_factors = np.asarray(backend.to_numpy(weights["rope_freqs.weight"]))
        #: Whether the last forward pass was pruned (for tests and reports).
        self.last_pruned = False

    # -- pieces ----------------------------------------------------------------------

    def _per_layer_inputs(self, tokens: np.ndarray, x: Any) -> Any:
        """PLE: ``(T, n_layer * P)``, layer ``il``'s slice at columns ``il*P:(il+1)*P``."""
        b, c, p = self.b, self.c, self.c.n_embd_per_layer
        n = len(tokens)
        token_part = b.scale(
            b.get_rows(self.w["per_layer_token_embd.weight"], tokens), math.sqrt(p)
        )
        proj = b.scale(b.matmul(x, self.w["per_layer_model_proj.weight"]), c.n_embd**-0.5)
        proj = b.rms_norm(
            proj.reshape(n, c.n_layer, p), self.w["per_layer_proj_norm.weight"], c.rms_eps
        )
        return b.scale(b.add(proj.reshape(n, c.n_layer * p), token_part), 2.0**-0.5)

    def _rope(self, il: int, x: Any, positions: np.ndarray) -> Any:
        c = self.c
        if c.swa_layers[il]:
            return self.b.rope(x, positions, c.head_dim_swa, c.rope_freq_base_swa, True)
        d = c.head_dim
        return self.b.rope_ext(x, positions, d, c.rope_freq_base, True, 1.0, self.rope_factors)

    def _attention(self, il: int, h: Any, positions: np.ndarray, kv: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        n, d = h.shape[0], c.layer_head_dim(il)
        q = b.matmul(h, w[p + "attn_q.weight"]).reshape(n, c.n_head, d)
        q = self._rope(il, b.rms_norm(q, w[p + "attn_q_norm.weight"], c.rms_eps), positions)
        if il < c.first_shared:
            k = b.matmul(h, w[p + "attn_k.weight"]).reshape(n, c.n_head_kv[il], d)
            v_weight = w.get(p + "attn_v.weight")
            v = k if v_weight is None else b.matmul(h, v_weight).reshape(n, c.n_head_kv[il], d)
            k = self._rope(il, b.rms_norm(k, w[p + "attn_k_norm.weight"], c.rms_eps), positions)
            b.set_rows(kv.k[il], kv.cells, k)
            b.set_rows(kv.v[il], kv.cells, b.rms_norm(v, None, c.rms_eps))
        window = c.n_swa if c.swa_layers[il] else 0
        # Scale 1: QK-norm already sets the logits' scale (transformers' ``scaling = 1.0``).
        out = kv.attend(b, self.sources[il], q, 1.0, window)
        return b.matmul(out, w[p + "attn_output.weight"])

    def _ffn(self, il: int, x: Any) -> Any:
        b, w, p = self.b, self.w, f"blk.{il}."
        h = b.rms_norm(x, w[p + "ffn_norm.weight"], self.c.rms_eps)
        gate = b.gelu(b.matmul(h, w[p + "ffn_gate.weight"]))
        up = b.mul(gate, b.matmul(h, w[p + "ffn_up.weight"]))
        out = b.matmul(up, w[p + "ffn_down.weight"])
        return b.rms_norm(out, w[p + "post_ffw_norm.weight"], self.c.rms_eps)

    def _per_layer_block(self, il: int, x: Any, ple: Any) -> Any:
        b, c, w, p = self.b, self.c, self.w, f"blk.{il}."
        width = c.n_embd_per_layer
        g = b.gelu(b.matmul(x, w[p + "inp_gate.weight"]))
        g = b.mul(g, ple[:, il * width : (il + 1) * width])
        g = b.rms_norm(b.matmul(g, w[p + "proj.weight"]), w[p + "post_norm.weight"], c.rms_eps)
        return b.add(x, g)

    @staticmethod
    def _rows_view(kv: Any, rows: np.ndarray) -> Any:
        """The KV view as the kept rows see it: their positions and sequences only."""
        return attrs.evolve(
            kv,
            cells=kv.cells[rows],
            positions=kv.positions[rows],
            seq_ids=kv.seq_ids[rows],
            built={},
        )

    # -- forward ---------------------------------------------------------------------

    def forward(self, inp: ForwardInput) -> Any:
        b, c, w = self.b, self.c, self.w
        n_tokens = len(inp.tokens)
        rows = inp.output_rows
        all_rows = len(rows) == n_tokens
        x = b.scale(b.get_rows(w["token_embd.weight"], inp.tokens), math.sqrt(c.n_embd))
        ple = self._per_layer_inputs(inp.tokens, x) if c.n_embd_per_layer else None
        positions, kv = inp.positions, inp.kv
        prune = inp.prune_ok and not inp.embeddings and not all_rows and c.n_kv_shared > 0
        self.last_pruned = prune
        for il in range(c.n_layer):
            if prune and il == c.first_shared:
                if not len(rows):  # nothing left to compute: the cache is complete
                    return b.zeros((0, c.n_vocab))
                # Layers from here on write no KV: only the output rows still matter.
                x = b.get_rows(x, rows)
                ple = None if ple is None else b.get_rows(ple, rows)
                positions, kv = positions[rows], self._rows_view(kv, rows)
            h = b.rms_norm(x, w[f"blk.{il}.attn_norm.weight"], c.rms_eps)
            attn = self._attention(il, h, positions, kv)
            if il == c.n_layer - 1 and not all_rows and not prune:
                # Only the rows that need outputs go through the last FFN and the head.
                attn, x = b.get_rows(attn, rows), b.get_rows(x, rows)
                ple = None if ple is None else b.get_rows(ple, rows)
            attn = b.rms_norm(attn, w[f"blk.{il}.post_attention_norm.weight"], c.rms_eps)
            x = b.add(x, attn)
            x = b.add(x, self._ffn(il, x))
            if ple is not None:
                x = self._per_layer_block(il, x, ple)
            x = b.mul(x, w[f"blk.{il}.layer_output_scale.weight"])
        x = b.rms_norm(x, w["output_norm.weight"], c.rms_eps)
        if inp.embeddings:
            return x
        logits = b.matmul(x, self.output)
        cap = c.final_logit_softcapping
        if cap:
            logits = b.scale(b.tanh(b.scale(logits, 1.0 / cap)), cap)
        return logits

"""The optional ops of the backend contract, and the batched transfers' defaults.

A backend may lack any op here: it declares the ones it has through
``Backend.supports(op)`` (a :class:`tessera.contract.ops.Op`), and the core falls back to
core ops when it declines.
Each op's default raises (the default probe declines, so the core never calls it) except
the batched transfers, whose defaults are the per-tensor path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class OptionalOps:
    """The optional ops, mixed into :class:`tessera.contract.backend.Backend`; the
    defaults call that class's core ops (``matmul``, ``add``, ``set_rows`` ...)."""

    name: str

    def attention_rows(self, q: Any, k_cache: Any, v_cache: Any, kv_rows: Any, scale: float) -> Any:
        """Optional: attention of each sequence's queries over only its own cache rows.

        ``kv_rows`` is a :class:`tessera.engine.kv_view.KVRows`: the queries of ``q`` ``(T, Hq,
        D)`` grouped into slices, each with the cells it attends to (``-1`` = padding, exactly
        like a ``-inf`` mask entry), causal by position inside a slice, optionally within
        a sliding window; GQA as in :meth:`attention`. Same result as :meth:`attention`
        with the equivalent dense mask, but the work is proportional to each slice's rows,
        not to the whole cache. Returns ``(T, Hq * Dv)`` in ubatch row order; a query with
        no allowed row yields zeros. Backends that implement it answer True to
        ``supports(op)`` for ``op.name == "attention_rows"``; the default declines.
        """
        # An optional op: the default probe declines it, so the core never calls this unless
        # a subclass both implements it and says so in supports().
        raise NotImplementedError(f"backend {self.name} does not implement attention_rows")

    def attention_softcap(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        n_kv: int,
        mask: np.ndarray,
        scale: float,
        softcap: float,
        sinks: Any = None,
    ) -> Any:
        """Optional: :meth:`attention` with the extras of ggml's ``flash_attn_ext``: scores
        soft-capped before the mask and softmax, and attention sinks.

        With ``softcap > 0`` each score ``s = scale * q.k`` becomes ``softcap * tanh(s /
        softcap)`` (Gemma 2's ``attn_logit_softcapping``; ggml caps the same place); 0
        leaves the scores as they are. ``sinks`` (float ``(Hq,)``, or None) is a learned
        logit per query head that joins each query's softmax denominator without a value
        (gpt-oss): the weights of the cells become ``exp(s_j) / (exp(sink) + sum_i
        exp(s_i))``, so they may sum to less than one, and a query with no allowed cell
        still gives zeros. Callers pass ``sinks`` by keyword and only when they have them.
        Arguments, masking and GQA are those of :meth:`attention`. Backends that implement
        it answer True to ``supports(op)`` for ``op.name == "attention_softcap"`` (with
        ``op.get("sinks")`` True when the model has sinks); the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement attention_softcap")

    def rope_ext(
        self,
        x: Any,
        positions: np.ndarray,
        n_rot: int,
        freq_base: float,
        neox: bool,
        freq_scale: float,
        freq_factors: np.ndarray | None,
        mscale: float = 1.0,
    ) -> Any:
        """Optional: :meth:`rope` with a divisor per rotated pair and a magnitude scale
        (GGML's ``ggml_rope_ext``).

        Pair ``i`` turns by ``pos * freq_scale * freq_base ** (-2i / n_rot) / freq_factors[i]``;
        ``freq_factors`` is float32 ``(n_rot / 2,)`` or None (all 1). A huge factor leaves a
        pair unrotated, which is how GGUF files store Gemma 4's proportional (partial) RoPE
        in ``rope_freqs.weight``; YaRN and LongRoPE are per-pair factors too. ``mscale``
        multiplies the rotated values (GGML's ``attn_factor``: cos and sin are scaled),
        never the ``head_dim - n_rot`` values that pass through; callers pass it by keyword
        and only when it is not 1. Backends that implement it answer True to
        ``supports(op)`` for ``op.name == "rope_ext"``; the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement rope_ext")

    def swiglu_oai(self, gate: Any, up: Any, alpha: float, limit: float) -> Any:
        """Optional: gpt-oss's clamped SwiGLU (ggml's ``swiglu_oai``), elementwise:
        ``g * sigmoid(alpha * g) * (u + 1)`` with ``g = min(gate, limit)`` and ``u`` the
        ``up`` values clipped to ``[-limit, limit]``.

        Backends that implement it answer True to ``supports(op)`` for ``op.name ==
        "swiglu_oai"``; the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement swiglu_oai")

    def tanh(self, x: Any) -> Any:
        """Optional: elementwise ``tanh(x)`` (logit soft-capping: ``c * tanh(x / c)``).

        Backends that implement it answer True to ``supports(op)`` for ``op.name == "tanh"``; the
        default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement tanh")

    def gelu_erf(self, x: Any) -> Any:
        """Optional: exact GELU, ``x * (1 + erf(x / sqrt(2))) / 2`` (BERT's ``gelu``).

        Backends that implement it answer True to ``supports(op)`` for ``op.name == "gelu_erf"``;
        the default declines, and architectures fall back to :meth:`gelu` (llama.cpp's tanh form).
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement gelu_erf")

    def linear(self, x: Any, w: Any, bias: Any, activation: str = "", residual: Any = None) -> Any:
        """Optional: ``matmul(x, w) + bias`` in one op (a dense layer with a bias, as in BERT).

        Same result as :meth:`matmul` then :meth:`add`, without a second pass over the
        output. ``activation`` (``"gelu"``: tanh form, ``"gelu_erf"``: exact) is applied to
        that, then ``residual`` (same shape as the output) is added: BERT's FFN up
        projection and its residual connections, fused where the backend can (the result
        may then be rounded once instead of twice). Backends that implement it answer True
        to ``supports(op)`` for ``op.name == "linear"`` (with ``op.get("activation")`` the
        activation asked for); the default declines and architectures call separate ops.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement linear")

    def matmul_n(
        self, x: Any, weights: Sequence[Any], biases: Sequence[Any | None] | None = None
    ) -> list[Any]:
        """``[matmul(x, weights[i]) (+ biases[i])]``: several weights that read the same input
        (an attention layer's Q/K/V, an FFN's gate and up) in one op.

        ``biases`` (or any entry of it) may be None for no bias. Backends that run the list
        in one call (the input prepared once, one parallel region) answer True to
        ``supports(op)`` for ``op.name == "matmul_n"``; this default is the per-weight path
        (:meth:`matmul`, then :meth:`add` for a bias), so architectures may always call it.
        """
        biases = biases if biases is not None else [None] * len(weights)
        out = []
        for w, bias in zip(weights, biases, strict=True):
            y = self.matmul(x, w)
            out.append(y if bias is None else self.add(y, bias))
        return out

    def gate_up_swiglu(self, x: Any, w_gate: Any, w_up: Any) -> Any:
        """``swiglu(matmul(x, w_gate), matmul(x, w_up))``: a SwiGLU FFN's gate and up
        projections and their product in one op.

        A backend may run it as one fused kernel (each output rounded once, from float32
        gate and up values, instead of after each step) and answer True to
        ``supports(op)`` for ``op.name == "gate_up_swiglu"``; this default composes :meth:`matmul_n`
        and
        :meth:`swiglu`, so architectures may always call it.
        """
        gate, up = self.matmul_n(x, [w_gate, w_up])
        return self.swiglu(gate, up)

    def concat(self, xs: Sequence[Any]) -> Any:
        """Optional: the arrays ``xs`` (equal shapes but for the last axis) joined along
        their last axis, in order (GGML's ``ggml_concat``: an MLA layer's query and cached
        K row, each a compressed part and a RoPE part).

        Backends that implement it answer True to ``supports(op)`` for ``op.name ==
        "concat"``; the default declines, and an architecture that needs it lists it in its
        ``required_ops``.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement concat")

    def matmul_heads(self, x: Any, w: Any) -> Any:
        """Optional: one matmul per head: ``x`` ``(T, H, K)`` and a loaded 3-D weight ``w``
        of ``(H, N, K)`` give ``(T, H, N)`` with ``out[:, h] = x[:, h] @ w[h].T`` (GGML's
        ``ggml_mul_mat`` over a 3-D weight: MLA's ``attn_k_b`` / ``attn_v_b``, which take
        each head to and from the compressed latent).

        Backends that implement it answer True to ``supports(op)`` for ``op.name ==
        "matmul_heads"``; the default declines, and an architecture that needs it lists it
        in its ``required_ops``.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement matmul_heads")

    def moe_ffn(
        self, x: Any, expert_ids: np.ndarray, expert_weights: np.ndarray, experts: Any
    ) -> Any:
        """Optional: routed SwiGLU experts, computing only the experts the rows selected.

        ``x`` is ``(T, n_embd)``; ``expert_ids`` int ``(T, k)`` and ``expert_weights``
        float32 ``(T, k)`` (numpy) say which experts each row chose and how much each
        counts; ``experts`` is a :class:`tessera.contract.experts.ExpertWeights`: call
        ``experts.get(ids)`` once with the distinct selected ids to get their loaded
        ``(gate, up, down)`` weights (it may fetch them from a slow tier or a cache).
        Returns ``sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` with
        ``e = expert_ids[t, j]``, shape ``(T, n_embd)``. Backends that implement it answer
        True to ``supports(op)`` for ``op.name == "moe_ffn"``; the default declines and the
        architecture uses :func:`tessera.contract.experts.moe_ffn_fallback` (core ops only).
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement moe_ffn")

    def kv_cache(self, shape: tuple[int, ...], cache_type: str) -> Any:
        """Optional: a zero-filled KV-cache array of ``shape`` ``(C, H, D)`` whose values are
        stored as ``cache_type`` (``"f16"``, ``"q8_0"`` ...; see :mod:`tessera.engine.kv_types`)
        instead of the compute dtype (llama.cpp's ``-ctk`` / ``-ctv``).

        Every op that takes a cache takes it: :meth:`set_rows` rounds the rows written into
        it to the type (exactly as :func:`tessera.engine.kv_types.stored_values` does), the
        attention ops read the stored values, :meth:`get_n` gives them as float32 and
        :meth:`set_n` rounds what it writes. Backends that store a type answer True to
        ``supports(op)`` for ``op.name == "kv_cache"`` with ``op.get("type")`` that type;
        the default declines (a context then refuses the type).
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not store a {cache_type} KV cache")

    # -- batched transfers (optional; the defaults below are the per-tensor fallback) ---

    def set_n(
        self,
        dsts: Sequence[Any],
        rows_list: Sequence[np.ndarray | None] | None,
        srcs: Sequence[np.ndarray],
    ) -> None:
        """In place, for every ``i``: ``dsts[i][rows_list[i]] = srcs[i]`` from host memory.

        ``srcs`` are numpy arrays (floats as float32); a ``rows`` of None (or ``rows_list``
        None) means all rows of the destination. A backend that moves the whole list in one
        transfer answers True to ``supports(op)`` for ``op.name == "set_n"``; this default is the
        per-tensor path (one :meth:`from_numpy` and one :meth:`set_rows` per tensor).
        """
        rows_list = rows_list if rows_list is not None else [None] * len(dsts)
        for dst, rows, src in zip(dsts, rows_list, srcs, strict=True):
            rows = np.arange(len(dst)) if rows is None else rows
            self.set_rows(dst, rows, self.from_numpy(src))

    def get_n(
        self, tensors: Sequence[Any], rows_list: Sequence[np.ndarray | None] | None = None
    ) -> list[np.ndarray]:
        """The values of ``tensors[i][rows_list[i]]`` as numpy arrays (floats as float32).

        A ``rows`` of None (or ``rows_list`` None) means the whole tensor. Backends that
        read the list back in one transfer answer True to ``supports(op)`` for ``op.name ==
        "get_n"``; this default is the per-tensor path (one :meth:`to_numpy` per tensor).
        """
        rows_list = rows_list if rows_list is not None else [None] * len(tensors)
        out = []
        for t, rows in zip(tensors, rows_list, strict=True):
            a = self.to_numpy(t)  # may share memory with t: copy, not a view, comes back
            out.append(np.array(a) if rows is None else a[np.asarray(rows)])
        return out

    def copy_n(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """In place, for every ``i``: ``dsts[i][...] = srcs[i]`` (backend arrays, same shapes).

        Backends that copy the list in one call answer True to ``supports(op)`` for ``op.name ==
        "copy_n"``; this default is the per-tensor path (one :meth:`set_rows` over all rows each).
        """
        for dst, src in zip(dsts, srcs, strict=True):
            self.set_rows(dst, np.arange(len(dst)), src)

"""The backend contract: the op set that architectures call, and the capability probe.

A backend owns arrays of its own kind (numpy arrays, torch tensors ...) in one compute
dtype. Architectures build their forward pass only from the methods below, so any backend
that implements them runs every architecture. Shapes use numpy order; ``T`` is the number
of token rows in the ubatch, ``H`` heads, ``D`` head size, ``C`` KV-cache cells.

Before it takes an optional path, the core asks ``supports(op, **attrs)`` with the op's
real parameters; a backend answers False for what it cannot do and the core falls back.
Every path taken is recorded with its reason in :attr:`Backend.placements`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:
    from tessera.contract.quant import QuantType, WeightKernel
    from tessera.files.gguf import RawTensor

#: The ops every backend implements (the conformance kit checks each one).
CORE_OPS = (
    "matmul",
    "get_rows",
    "add",
    "mul",
    "scale",
    "rms_norm",
    "layer_norm",
    "rope",
    "silu",
    "gelu",
    "swiglu",
    "attention",
    "set_rows",
)

#: Ops a backend may lack; it declares them through :meth:`Backend.supports`. The batched
#: transfers (``set_n``, ``get_n``, ``copy_n``) have a per-tensor default here, which the
#: core calls instead when the probe declines them.
OPTIONAL_OPS = (
    "attention_rows",
    "set_n",
    "get_n",
    "copy_n",
    "rope_ext",
    "tanh",
    "gelu_erf",
    "moe_ffn",
    "linear",
    "matmul_n",
    "gate_up_swiglu",
    "decoder_block",
)


@attrs.frozen
class BackendInfo:
    """What a backend plugin registers: a name and a factory ``create(device, dtype)``.

    ``device`` is ``None`` (the best device the backend has) or e.g. ``"cpu"``, ``"cuda:0"``;
    ``dtype`` is ``None`` (the backend's choice, e.g. bf16 where bf16 matmul is fast) or
    ``"f32"`` / ``"bf16"`` / ``"f16"``. ``create`` raises
    :class:`tessera.errors.UnknownBackendError` when it cannot run with those settings.
    """

    name: str
    create: Callable[..., Backend] = attrs.field(eq=False, repr=False)
    description: str = ""
    #: With no ``--backend``, backends are tried highest priority first (ties by name) and
    #: the first whose ``create`` succeeds runs. The numpy reference is 0; a fast backend
    #: registers more.
    priority: int = 0


class Backend(ABC):
    """Base class of compute backends. Subclasses implement every abstract op."""

    #: Registered name, e.g. ``"numpy"``.
    name: str = ""
    #: Device string, e.g. ``"cpu"`` or ``"cuda:0"``.
    device: str = "cpu"
    #: Compute dtype of activations and the KV cache: ``"f32"``, ``"bf16"`` or ``"f16"``.
    dtype: str = "f32"

    def __init__(self) -> None:
        #: ``(what, path, reason)`` for every decision the backend made (weights, ops).
        self.placements: list[tuple[str, str, str]] = []

    # -- capability probe ------------------------------------------------------------

    def supports(self, op: str, **attrs: Any) -> bool:
        """Whether this backend can run ``op`` with these parameters (dtypes, shapes ...).

        The default answers True for every op in :data:`CORE_OPS`; backends override it
        to decline optional ops or parameter combinations they cannot handle.
        """
        return op in CORE_OPS

    def use_kernels(self, kernels: Mapping[tuple[str, str], WeightKernel]) -> None:  # noqa: B027
        """Receive the registered weight kernels, keyed by ``(backend name, quant type name)``.

        Called by the loader before any :meth:`load_weight`. The default ignores them
        (a backend that never keeps weights quantized needs none).
        """

    def set_threads(self, n_threads: int) -> None:  # noqa: B027
        """Use ``n_threads`` CPU threads (``-t``); backends without a thread pool ignore it."""

    def record(self, what: str, path: str, reason: str) -> None:
        """Note which path was taken for ``what`` and why (shown by ``tessera plugins``)."""
        self.placements.append((what, path, reason))

    # -- arrays ----------------------------------------------------------------------

    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Any:
        """A backend array with the values of ``a``: floats in the compute dtype, ints kept."""

    @abstractmethod
    def to_numpy(self, x: Any) -> np.ndarray:
        """The values of backend array ``x`` as a numpy array (floats as float32)."""

    @abstractmethod
    def zeros(self, shape: tuple[int, ...]) -> Any:
        """A zero-filled array in the compute dtype (used for the KV cache, made once)."""

    @abstractmethod
    def load_weight(self, raw: RawTensor, qtype: QuantType) -> Any:
        """Make a model weight usable by :meth:`matmul` and :meth:`get_rows`.

        ``qtype`` decodes ``raw``. A backend may keep quantized weights quantized (its own
        packed layout) or dequantize them. A 1-D weight (norm scale, bias) must come back
        as a plain array in the compute dtype, so it can be passed to :meth:`add`,
        :meth:`mul`, :meth:`rms_norm` ...
        """

    # -- ops -------------------------------------------------------------------------

    @abstractmethod
    def matmul(self, x: Any, w: Any) -> Any:
        """``x @ W.T``: ``x`` is ``(T, n_in)``, ``w`` a loaded weight of ``(n_out, n_in)``."""

    @abstractmethod
    def get_rows(self, w: Any, ids: np.ndarray) -> Any:
        """Rows ``ids`` of ``w``, in the compute dtype.

        ``w`` is a loaded weight (an embedding lookup) or an activation array (the core
        uses it to keep only the rows that need outputs).
        """

    @abstractmethod
    def add(self, a: Any, b: Any) -> Any:
        """Elementwise ``a + b`` with numpy broadcasting."""

    @abstractmethod
    def mul(self, a: Any, b: Any) -> Any:
        """Elementwise ``a * b`` with numpy broadcasting."""

    @abstractmethod
    def scale(self, x: Any, s: float) -> Any:
        """``x * s`` for a Python float ``s``."""

    @abstractmethod
    def rms_norm(self, x: Any, weight: Any | None, eps: float) -> Any:
        """``x / sqrt(mean(x**2, -1) + eps) * weight`` over the last axis (weight optional)."""

    @abstractmethod
    def layer_norm(self, x: Any, weight: Any | None, bias: Any | None, eps: float) -> Any:
        """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis."""

    @abstractmethod
    def rope(
        self,
        x: Any,
        positions: np.ndarray,
        n_rot: int,
        freq_base: float,
        neox: bool,
        freq_scale: float = 1.0,
    ) -> Any:
        """Rotary position embedding of ``x`` ``(T, H, D)`` at integer ``positions`` ``(T,)``.

        The first ``n_rot`` values of each head are rotated with angle
        ``pos * freq_scale * freq_base ** (-2i / n_rot)`` for pair ``i``; the rest pass
        through. ``neox=False`` pairs adjacent values ``(2i, 2i+1)`` (GGML's normal mode,
        used by the ``llama`` arch); ``neox=True`` pairs ``(i, i + n_rot/2)``.
        """

    @abstractmethod
    def silu(self, x: Any) -> Any:
        """``x * sigmoid(x)``."""

    @abstractmethod
    def gelu(self, x: Any) -> Any:
        """GELU with the tanh approximation (as GGML's ``gelu``)."""

    @abstractmethod
    def swiglu(self, gate: Any, up: Any) -> Any:
        """``silu(gate) * up``."""

    @abstractmethod
    def attention(
        self,
        q: Any,
        k_cache: Any,
        v_cache: Any,
        n_kv: int,
        mask: np.ndarray,
        scale: float,
    ) -> Any:
        """Masked softmax attention of queries over the first ``n_kv`` cache cells.

        ``q`` is ``(T, Hq, D)``; ``k_cache`` ``(C, Hkv, D)`` and ``v_cache`` ``(C, Hkv, Dv)``
        with ``Hq`` a multiple of ``Hkv`` (grouped-query attention: query head ``h`` reads
        KV head ``h // (Hq // Hkv)``). ``mask`` is a numpy bool ``(T, n_kv)``, True where
        the query may attend. A query row with no allowed cell yields zeros. Returns
        ``(T, Hq * Dv)``.
        """

    def attention_rows(self, q: Any, k_cache: Any, v_cache: Any, kv_rows: Any, scale: float) -> Any:
        """Optional: attention of each sequence's queries over only its own cache rows.

        ``kv_rows`` is a :class:`tessera.engine.kv_cache.KVRows`: the queries of ``q`` ``(T, Hq,
        D)`` grouped into slices, each with the cells it attends to (``-1`` = padding, exactly
        like a ``-inf`` mask entry), causal by position inside a slice, optionally within
        a sliding window; GQA as in :meth:`attention`. Same result as :meth:`attention`
        with the equivalent dense mask, but the work is proportional to each slice's rows,
        not to the whole cache. Returns ``(T, Hq * Dv)`` in ubatch row order; a query with
        no allowed row yields zeros. Backends that implement it answer True to
        ``supports("attention_rows", ...)``; the default declines.
        """
        # An optional op: the default probe declines it, so the core never calls this unless
        # a subclass both implements it and says so in supports().
        raise NotImplementedError(f"backend {self.name} does not implement attention_rows")

    def rope_ext(
        self,
        x: Any,
        positions: np.ndarray,
        n_rot: int,
        freq_base: float,
        neox: bool,
        freq_scale: float,
        freq_factors: np.ndarray,
    ) -> Any:
        """Optional: :meth:`rope` with a divisor per rotated pair (GGML's ``ggml_rope_ext``).

        Pair ``i`` turns by ``pos * freq_scale * freq_base ** (-2i / n_rot) / freq_factors[i]``;
        ``freq_factors`` is float32 ``(n_rot / 2,)``. A huge factor leaves a pair unrotated,
        which is how GGUF files store Gemma 4's proportional (partial) RoPE in
        ``rope_freqs.weight``. Backends that implement it answer True to
        ``supports("rope_ext", ...)``; the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement rope_ext")

    def tanh(self, x: Any) -> Any:
        """Optional: elementwise ``tanh(x)`` (logit soft-capping: ``c * tanh(x / c)``).

        Backends that implement it answer True to ``supports("tanh")``; the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement tanh")

    def gelu_erf(self, x: Any) -> Any:
        """Optional: exact GELU, ``x * (1 + erf(x / sqrt(2))) / 2`` (BERT's ``gelu``).

        Backends that implement it answer True to ``supports("gelu_erf")``; the default
        declines, and architectures fall back to :meth:`gelu` (llama.cpp's tanh form).
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
        to ``supports("linear")`` and, for an activation, ``supports("linear",
        activation=name)``; the default declines and architectures call separate ops.
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
        ``supports("matmul_n")``; this default is the per-weight path (:meth:`matmul`,
        then :meth:`add` for a bias), so architectures may always call it.
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
        ``supports("gate_up_swiglu")``; this default composes :meth:`matmul_n` and
        :meth:`swiglu`, so architectures may always call it.
        """
        gate, up = self.matmul_n(x, [w_gate, w_up])
        return self.swiglu(gate, up)

    def decoder_block(
        self,
        x: Any,
        block: Any,
        k_cache: Any,
        v_cache: Any,
        cell: int,
        kv_rows: Any,
        positions: np.ndarray,
    ) -> Any | None:
        """Optional: a whole llama-family decoder block for one decode token, or None.

        ``x`` is the ``(1, n_embd)`` hidden state (the op may write its result over it:
        callers pass a value they no longer need), ``block`` a
        :class:`tessera.contract.fusion.DecoderBlock` (this layer's loaded weights and shape),
        ``k_cache``/``v_cache`` the layer's ``(C, Hkv, D)`` caches, ``cell`` the cache cell
        the token's rotated K and its V go to, ``kv_rows`` the token's
        :class:`tessera.engine.kv_cache.KVRows` (as :meth:`attention_rows` gets them) and
        ``positions`` its position (``(1,)``). Returns the block's output ``(1, n_embd)``
        with K/V written, the same as the block's ops one by one (rounding aside), or None
        — with nothing written — when this backend cannot run this block or this step
        (weights of a type it has no fused kernel for, a sliding window, ...); the
        architecture then runs the ops. Backends that may run it answer True to
        ``supports("decoder_block")``; the default declines.
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement decoder_block")

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
        True to ``supports("moe_ffn", ...)``; the default declines and the architecture
        uses :func:`tessera.contract.experts.moe_ffn_fallback` (core ops only).
        """
        # An optional op: the default probe declines it (see attention_rows).
        raise NotImplementedError(f"backend {self.name} does not implement moe_ffn")

    @abstractmethod
    def set_rows(self, dst: Any, rows: np.ndarray, src: Any) -> None:
        """In place: ``dst[rows] = src`` (writes new K/V into cache cells)."""

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
        transfer answers True to ``supports("set_n")``; this default is the per-tensor path
        (one :meth:`from_numpy` and one :meth:`set_rows` per tensor).
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
        read the list back in one transfer answer True to ``supports("get_n")``; this
        default is the per-tensor path (one :meth:`to_numpy` per tensor).
        """
        rows_list = rows_list if rows_list is not None else [None] * len(tensors)
        out = []
        for t, rows in zip(tensors, rows_list, strict=True):
            a = self.to_numpy(t)  # may share memory with t: copy, not a view, comes back
            out.append(np.array(a) if rows is None else a[np.asarray(rows)])
        return out

    def copy_n(self, dsts: Sequence[Any], srcs: Sequence[Any]) -> None:
        """In place, for every ``i``: ``dsts[i][...] = srcs[i]`` (backend arrays, same shapes).

        Backends that copy the list in one call answer True to ``supports("copy_n")``;
        this default is the per-tensor path (one :meth:`set_rows` over all rows each).
        """
        for dst, src in zip(dsts, srcs, strict=True):
            self.set_rows(dst, np.arange(len(dst)), src)

    def forward_scope(self) -> AbstractContextManager[Any]:
        """A context the core enters around each forward pass of a model graph (one
        ubatch), for per-thread settings that make the ops cheaper; the default does
        nothing. Ops must give the same results inside and outside it. The torch backend
        enters ``torch.inference_mode()`` (no autograd bookkeeping per op)."""
        return nullcontext()

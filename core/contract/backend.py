"""The backend contract: the op set that architectures call, and the capability probe.

A backend owns arrays of its own kind (numpy arrays, torch tensors ...) in one compute
dtype. Architectures build their forward pass only from the methods below, so any backend
that implements them runs every architecture. Shapes use numpy order; ``T`` is the number
of token rows in the ubatch, ``H`` heads, ``D`` head size, ``C`` KV-cache cells.

Before it takes an optional path, the core asks ``supports(op)`` with the op described
(:class:`tessera.contract.ops.Op`: name, dtype, shapes, parameters), then ``worth(op)``;
a backend answers False for what it cannot do (or would rather not) and the core falls back.
Every path taken is recorded with its reason: per weight and per context in
:attr:`Backend.placements`, and the backend's own switched paths (native kernels, fused
ops ...), each chosen once through :func:`tessera.switches.choose`, in :attr:`Backend.paths`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from tessera.contract.ops import Op
from tessera.contract.optional_ops import OptionalOps
from tessera.contract.recurrent_ops import RecurrentOps

if TYPE_CHECKING:
    from tessera.contract.fusion import BlockFusion
    from tessera.contract.quant import QuantType, WeightKernel
    from tessera.files.gguf import RawTensor
    from tessera.switches import Choice

log = logging.getLogger("tessera.backend")

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
    "attention_softcap",
    "set_n",
    "get_n",
    "copy_n",
    "rope_ext",
    "tanh",
    "swiglu_oai",
    "gelu_erf",
    "moe_ffn",
    "linear",
    "matmul_n",
    "gate_up_swiglu",
    "concat",
    "matmul_heads",
    "kv_cache",
    "sigmoid",
    "ssm_conv",
    "gated_delta_net",
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


class Backend(OptionalOps, RecurrentOps, ABC):
    """Base class of compute backends. Subclasses implement every abstract op; the
    optional ops (:class:`tessera.contract.optional_ops.OptionalOps`,
    :class:`tessera.contract.recurrent_ops.RecurrentOps`) where they can."""

    #: Registered name, e.g. ``"numpy"``.
    name: str = ""
    #: Device string, e.g. ``"cpu"`` or ``"cuda:0"``.
    device: str = "cpu"
    #: Compute dtype of activations and the KV cache: ``"f32"``, ``"bf16"`` or ``"f16"``.
    dtype: str = "f32"

    def __init__(self) -> None:
        #: ``(what, path, reason)`` for every decision the backend made (weights, ops).
        self.placements: list[tuple[str, str, str]] = []
        #: The backend's own switched paths by name (e.g. "native kernels"), each the
        #: :class:`tessera.switches.Choice` made when it was first needed.
        self.paths: dict[str, Choice] = {}
        #: The block fusions registered for this backend, by kind of block.
        self.fusions: dict[str, BlockFusion] = {}

    # -- capability probe ------------------------------------------------------------

    def supports(self, op: Op) -> bool:
        """Whether this backend *can* run ``op`` (its name, dtype, shapes and parameters).

        The default answers True for every op in :data:`CORE_OPS`; backends override it
        to take optional ops or to decline parameter combinations they cannot handle. A
        declined optional op is never called: the core composes it from core ops or takes
        another path.
        """
        return op.name in CORE_OPS

    def worth(self, op: Op) -> bool:
        """Optional: whether the backend *prefers* ``op`` where the core could take another
        path (row lists or a dense mask, a fused op or its parts). Asked only after
        :meth:`supports` said yes; the default says yes. A backend that can run an op
        but knows it loses to the fallback on this device answers False here, so the
        conformance kit still checks the op."""
        return True

    def use_kernels(self, kernels: Mapping[tuple[str, str], WeightKernel]) -> None:  # noqa: B027
        """Receive the registered weight kernels, keyed by ``(backend name, quant type name)``.

        Called by the loader before any :meth:`load_weight`. The default ignores them
        (a backend that never keeps weights quantized needs none).
        """

    def use_fusions(self, fusions: Mapping[tuple[str, str], BlockFusion]) -> None:
        """Receive the registered block fusions, keyed by ``(backend name, kind of block)``;
        this backend keeps those registered for its name. Called by the loader before the
        graph is built."""
        self.fusions = {block: f for (backend, block), f in fusions.items() if backend == self.name}

    def fusion(self, block: str) -> BlockFusion | None:
        """The fusion of ``block`` (e.g. :data:`tessera.contract.fusion.LLAMA_DECODER`)
        for this backend when one is registered and its probe passes here, else None."""
        found = self.fusions.get(block)
        return found if found is not None and found.probe(self) else None

    def set_threads(self, n_threads: int) -> None:  # noqa: B027
        """Use ``n_threads`` CPU threads (``-t``); backends without a thread pool ignore it."""

    def record(self, what: str, path: str, reason: str) -> None:
        """Note which path was taken for ``what`` and why (shown by ``tessera plugins``)."""
        self.placements.append((what, path, reason))

    def record_path(self, what: str, choice: Choice) -> Choice:
        """Keep ``choice`` as the backend's path for ``what`` (shown by ``tessera plugins``
        and logged once, so ``-v`` prints it) and return it."""
        if self.paths.get(what) != choice:
            log.info("%s backend: %s: %s", self.name, what, choice)
        self.paths[what] = choice
        return choice

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

    @abstractmethod
    def set_rows(self, dst: Any, rows: np.ndarray, src: Any) -> None:
        """In place: ``dst[rows] = src`` (writes new K/V into cache cells)."""

    def forward_scope(self) -> AbstractContextManager[Any]:
        """A context the core enters around each forward pass of a model graph (one
        ubatch), for per-thread settings that make the ops cheaper; the default does
        nothing. Ops must give the same results inside and outside it. The torch backend
        enters ``torch.inference_mode()`` (no autograd bookkeeping per op)."""
        return nullcontext()

"""Mixture-of-experts plumbing shared by MoE architectures, the loader and expert caches.

An MoE architecture declares its routed experts with :class:`ExpertLayout` (GGUF's stacked
``blk.N.ffn_{gate,up,down}_exps.weight`` tensors, ``(n_expert, rows, cols)``). The loader
does not hand those stacks to the backend whole; it builds one :class:`ExpertWeights` per
MoE layer and passes them to ``Architecture.build(..., experts=...)`` as a
:class:`ModelExperts`:

- a resident layer (the default) loads every expert once, as the backend's fast form
  (:class:`ResidentExperts`);
- an offloaded layer (``--cpu-moe``, ``-ncmoe N``) keeps its experts in the slow tier,
  the memory-mapped file, and converts an expert each time it is used
  (:class:`SlowExperts`), unless an expert cache plugin (``--moe-cache-mib``) keeps the
  converted experts that tokens use, within a byte budget.

The routed-experts op (``moe_ffn``, optional) only computes the experts a ubatch selected;
:func:`moe_ffn_fallback` composes the same result from core ops for backends without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from tessera.contract.arch import check_tensors
from tessera.contract.ops import Op
from tessera.files.gguf import RawTensor
from tessera.switches import MOE_FFN_DISABLE, Choice, choose

#: The variable that takes the core-op fallback even where the backend has ``moe_ffn``
#: (declared in :mod:`tessera.switches`).
MOE_FFN_DISABLE_ENV = MOE_FFN_DISABLE.name


@attrs.frozen
class MoEOptions:
    """How a model's experts are placed (llama.cpp's flag names).

    ``n_cpu_moe``: the experts of the first N MoE layers stay in the slow tier (``-ncmoe``);
    ``cpu_moe``: all of them do (``--cpu-moe``). ``cache_mib``: the byte budget of the
    expert cache for offloaded experts (``--moe-cache-mib``, 0 = no cache); ``shared``:
    one cache, one budget, for every model and backend of the runtime
    (``--moe-cache-shared``).
    """

    cache_mib: float = attrs.field(default=0.0, validator=attrs.validators.ge(0))
    shared: bool = False
    n_cpu_moe: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    cpu_moe: bool = False

    def offloaded(self, moe_index: int) -> bool:
        """Whether the ``moe_index``-th MoE layer (counting from 0) keeps experts offloaded."""
        return self.cpu_moe or moe_index < self.n_cpu_moe

    @property
    def cache_bytes(self) -> int:
        return int(self.cache_mib * 1024 * 1024)


@attrs.frozen
class ExpertCacheInfo:
    """What an expert-cache plugin registers: ``create(budget_bytes)`` makes a cache (see
    ``tessera_register_expert_caches`` for the object it returns)."""

    name: str
    create: Callable[[int], Any] = attrs.field(eq=False, repr=False)
    description: str = ""


@attrs.frozen
class ExpertTensors:
    """The stacked expert tensors of one MoE layer (GGUF names)."""

    layer: int
    gate: str
    up: str
    down: str

    @property
    def names(self) -> tuple[str, str, str]:
        return (self.gate, self.up, self.down)


@attrs.frozen
class ExpertLayout:
    """An architecture's routed experts: counts and, per MoE layer, its stacked tensors."""

    n_expert: int
    n_expert_used: int
    layers: tuple[ExpertTensors, ...]


class ExpertWeights(Protocol):
    """The experts of one layer, as the routed-experts op reads them."""

    n_expert: int

    def get(self, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        """Loaded ``(gate, up, down)`` weights (backend form) of each expert, in order."""


@attrs.define
class ModelExperts:
    """Every MoE layer's :class:`ExpertWeights`, by layer index, plus what serves them."""

    layers: dict[int, Any]
    #: The expert cache in use (``stats()``, ``clear()``), or None.
    cache: Any = None

    def layer(self, il: int) -> Any:
        return self.layers[il]

    def slow_layers(self) -> list[SlowExperts]:
        """The offloaded layers' slow tiers (what a cache, if any, wraps)."""
        return [getattr(e, "slow", e) for e in self.layers.values() if _is_slow(e)]


def _is_slow(e: Any) -> bool:
    return isinstance(getattr(e, "slow", e), SlowExperts)


def loaded_nbytes(w: Any) -> int:
    """Bytes a loaded weight holds: numpy arrays and torch tensors have ``nbytes``; kernel
    objects (packed quantized weights) are the sum of the arrays they keep."""
    if hasattr(w, "nbytes"):
        return int(w.nbytes)
    return sum(int(v.nbytes) for v in vars(w).values() if hasattr(v, "nbytes"))


def _span(raw: RawTensor, qtype: Any, expert: int) -> slice:
    """The bytes of expert ``expert`` in a stacked ``(n_expert, rows, cols)`` tensor (quantized
    rows never straddle experts, so slicing the file's bytes is exact and copies nothing)."""
    _, rows, cols = raw.shape
    size = rows * qtype.row_bytes(cols)
    return slice(expert * size, (expert + 1) * size)


def _expert_raw(raw: RawTensor, qtype: Any, shape: tuple, expert: int) -> RawTensor:
    """Expert ``expert`` of a stacked tensor as a 2-D tensor over its bytes in the file."""
    return RawTensor(
        f"{raw.name}[{expert}]", raw.ggml_type, shape, raw.data[_span(raw, qtype, expert)]
    )


class SlowExperts:
    """The slow tier: one layer's experts left in the memory-mapped file, converted every
    time they are fetched to the form the backend multiplies fastest: each expert's
    ``(rows, cols)`` slice of the file's bytes through the backend's ``load_weight``, as a
    2-D weight of its type would load (a quant kernel over the bytes in place where the
    backend has one, else dequantized to the compute dtype on its device). What a
    conversion costs (dequantize, copy to the device) is what a cache hit saves."""

    def __init__(
        self, raws: tuple[RawTensor, RawTensor, RawTensor], qtypes: tuple, backend: Any, key: str
    ) -> None:
        self.raws, self.qtypes, self.backend = raws, qtypes, backend
        #: Identifies this layer's experts in a shared cache (file, tensor, backend form).
        self.key = key
        self.n_expert = raws[0].shape[0]
        self.shapes = tuple(r.shape[1:] for r in raws)
        #: Experts converted and bytes of backend form produced (the miss path's cost).
        self.loads = 0
        self.bytes_loaded = 0
        #: The backend's (path, reason) for the gate/up/down weights, from the first load.
        self.paths: tuple[tuple[str, str], ...] = ()

    def load(self, expert: int) -> tuple[Any, Any, Any]:
        placements = self.backend.placements
        mark = len(placements)
        out = tuple(
            self.backend.load_weight(_expert_raw(raw, qt, shape, expert), qt)
            for raw, qt, shape in zip(self.raws, self.qtypes, self.shapes, strict=True)
        )
        # one record per layer (build_experts), not one per expert and fetch
        self.paths = self.paths or tuple((path, why) for _, path, why in placements[mark:])
        del placements[mark:]
        self.loads += 1
        self.bytes_loaded += sum(loaded_nbytes(w) for w in out)
        return out

    def get(self, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        return [self.load(int(e)) for e in experts]

    def expert_nbytes(self) -> int:
        """Bytes of one expert in the backend's form (every expert of a layer is alike)."""
        return sum(loaded_nbytes(w) for w in self.load(0))


class ResidentExperts:
    """Every expert of one layer loaded once, in the backend's fast form."""

    def __init__(self, slow: SlowExperts) -> None:
        self.n_expert = slow.n_expert
        self.experts = [slow.load(e) for e in range(slow.n_expert)]

    def get(self, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        return [self.experts[int(e)] for e in experts]


class StackedExperts:
    """Experts as slices of loaded stacked ``(n_expert, rows, cols)`` arrays (when a graph is
    built straight from loaded weights, without the loader's placement)."""

    def __init__(self, gate: Any, up: Any, down: Any) -> None:
        self.stacks = (gate, up, down)
        self.n_expert = gate.shape[0]

    def get(self, experts: Sequence[int]) -> list[tuple[Any, Any, Any]]:
        return [tuple(s[int(e)] for s in self.stacks) for e in experts]


def checked_experts(
    arch: str,
    layout: ExpertLayout,
    tensor_names: Iterable[str],
    weights: Any,
    experts: ModelExperts | None,
) -> ModelExperts:
    """What an MoE architecture's ``build`` starts with: refuse a missing tensor, then the
    loader's ``experts`` (their stacked tensors are then not in ``weights``), or without
    them every expert resident from the stacked tensors in ``weights``."""
    stacked = {n for t in layout.layers for n in t.names}
    check_tensors(arch, [n for n in tensor_names if experts is None or n not in stacked], weights)
    if experts is not None:
        return experts
    return ModelExperts(
        {t.layer: StackedExperts(*(weights[n] for n in t.names)) for t in layout.layers}
    )


def build_experts(
    layout: ExpertLayout,
    raw: dict[str, RawTensor],
    qtypes: dict[str, Any],
    backend: Any,
    options: MoEOptions,
    cache: Any,
    source: str,
) -> ModelExperts:
    """One :class:`ExpertWeights` per MoE layer, placed as ``options`` say.

    ``cache`` is an expert cache (from an expert-cache plugin) that wraps offloaded
    layers, or None (offloaded experts are converted on every use). ``source`` names the
    model file, so a shared cache never mixes two models' experts.
    """
    layers: dict[int, Any] = {}
    form = f"{backend.name}:{backend.device}:{backend.dtype}"
    for index, t in enumerate(layout.layers):
        slow = SlowExperts(
            tuple(raw[n] for n in t.names),
            tuple(qtypes[n] for n in t.names),
            backend,
            f"{source}:{t.gate}:{form}",
        )
        what = f"blk.{t.layer} experts"
        if not options.offloaded(index):
            layers[t.layer] = ResidentExperts(slow)
            paths = sorted({path for path, _ in slow.paths})
            backend.record(what, f"resident: {', '.join(paths)}", "loaded once")
        elif cache is not None:
            layers[t.layer] = cache.wrap(slow)
            backend.record(what, "offloaded, cached", "slow tier (--cpu-moe/-ncmoe) + cache")
        else:
            layers[t.layer] = slow
            backend.record(what, "offloaded", "slow tier, converted at every use (no cache)")
    return ModelExperts(layers, cache)


def moe_ffn_enabled(backend: Any, **params: Any) -> Choice:
    """Whether to call the backend's ``moe_ffn`` op, and why (switch, probe)."""

    def probe() -> tuple[bool, str]:
        described = Op("moe_ffn", params, backend.dtype)
        if not backend.supports(described):
            return False, f"backend {backend.name} declines moe_ffn"
        if not backend.worth(described):
            return False, f"backend {backend.name} prefers the core ops for moe_ffn"
        return True, "backend supports moe_ffn"

    return choose(MOE_FFN_DISABLE, probe)


def moe_ffn_fallback(
    backend: Any, x: Any, expert_ids: np.ndarray, expert_weights: np.ndarray, experts: Any
) -> Any:
    """The routed experts from core ops only: each selected expert runs over all ``T`` rows
    and its output is scaled by a per-row weight column that is zero where a row did not
    choose it. Still only the experts the ubatch selected are computed."""
    b = backend
    used = np.unique(expert_ids)
    out = None
    for e, (gate, up, down) in zip(used, experts.get(used.tolist()), strict=True):
        column = np.where(expert_ids == e, expert_weights, 0.0).sum(axis=-1, keepdims=True)
        y = b.matmul(b.swiglu(b.matmul(x, gate), b.matmul(x, up)), down)
        y = b.mul(y, b.from_numpy(column.astype(np.float32)))
        out = y if out is None else b.add(out, y)
    return out

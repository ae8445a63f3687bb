"""Communicators: collectives between the ranks of one tensor-parallel group.

A communicator plugin registers a :class:`CommunicatorInfo` (hook
``tessera_register_communicators``). Before a group forms, every rank runs each
communicator's ``probe(device)`` and sends the answers to rank 0; the tensor-parallel
plugin then picks, on rank 0 and for everyone, the first communicator that *every* rank can
use (:mod:`tessera.plugins.tensor_parallel.choice`): the one named by ``--communicator`` /
``TESSERA_COMMUNICATOR``, else a collective one (``collective=True``), else a
point-to-point one whose ``max_ranks`` covers the group.

The created :class:`Communicator` works on numpy arrays and torch tensors alike and
counts calls and bytes per collective (the benchmark reports them per token).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from tessera.errors import TesseraError
from tessera.switches import COMMUNICATOR

#: The variable naming the communicator to use, like ``--communicator`` (the switch for
#: A/B runs; declared in :mod:`tessera.switches`).
COMMUNICATOR_ENV = COMMUNICATOR.name
#: Seconds a collective may wait for the other ranks before the group is declared broken.
DEFAULT_TIMEOUT_S = 60.0


class CommunicatorError(TesseraError):
    """A group could not form, or a collective failed (a rank died, hung or disagreed)."""


@attrs.frozen
class CommunicatorProbe:
    """One rank's answer to a communicator's probe.

    ``features`` are the transports it can use here (``("gloo", "nccl")``); the group
    uses the features every rank offers. ``reason`` says why it is not usable.
    """

    usable: bool
    features: tuple[str, ...] = ()
    reason: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"usable": self.usable, "features": list(self.features), "reason": self.reason}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CommunicatorProbe:
        return cls(bool(data["usable"]), tuple(data.get("features", ())), data.get("reason", ""))


@attrs.frozen
class GroupSpec:
    """Everything a communicator needs to join its group.

    ``host:port`` is where rank 0's communicator listens (rank 0 picked the free port);
    ``local_host`` is this rank's own address on the route to rank 0; ``features`` are
    those every rank offered; ``device`` is this rank's backend device (``cpu``,
    ``cuda:0``); ``timeout_s`` bounds every wait.
    """

    rank: int
    world_size: int
    host: str
    port: int
    timeout_s: float
    device: str = "cpu"
    features: tuple[str, ...] = ()
    local_host: str = "127.0.0.1"


@attrs.frozen
class CommunicatorInfo:
    """What a communicator plugin registers.

    ``probe(device)`` returns a :class:`CommunicatorProbe` and must be cheap and safe
    (no network). ``create(spec)`` joins the group described by a :class:`GroupSpec`
    and returns a :class:`Communicator`; it raises :class:`CommunicatorError` when the
    group cannot form within ``spec.timeout_s``. ``collective`` is True for a library of
    real collectives (preferred); ``max_ranks`` caps the group size (None: no cap).
    """

    name: str
    create: Callable[[GroupSpec], Communicator] = attrs.field(eq=False, repr=False)
    probe: Callable[[str], CommunicatorProbe] = attrs.field(eq=False, repr=False)
    description: str = ""
    collective: bool = True
    max_ranks: int | None = None


def nbytes(x: Any) -> int:
    """Size in bytes of a numpy array or torch tensor."""
    if hasattr(x, "nbytes") and not hasattr(x, "element_size"):
        return int(x.nbytes)
    return int(x.numel() * x.element_size())


class Communicator(ABC):
    """Collectives of one rank in a group. Arrays are numpy arrays or torch tensors.

    Subclasses implement the ``_``-prefixed methods; the public ones count calls and
    bytes in :attr:`stats`. Every call blocks until the other ranks take part or the
    group's timeout passes, then raises :class:`CommunicatorError`. All ranks must call
    the same collectives in the same order with arrays of the same shape and dtype.
    """

    #: Registered name of the plugin, e.g. ``"torch-distributed"``.
    name: str = ""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        #: op name -> ``[calls, bytes sent in by this rank]``.
        self.stats: dict[str, list[int]] = {}
        #: Which transport was taken and why (``gloo``: "every rank is on cpu").
        self.path = ""

    def _count(self, op: str, x: Any) -> None:
        entry = self.stats.setdefault(op, [0, 0])
        entry[0] += 1
        entry[1] += 0 if x is None else nbytes(x)

    def all_reduce(self, x: Any) -> Any:
        """The elementwise sum of ``x`` over all ranks (same kind, shape and dtype as ``x``;
        ``x`` itself may be overwritten). Every rank gets bit-identical values."""
        self._count("all_reduce", x)
        return self._all_reduce(x)

    def all_gather(self, x: Any) -> Any:
        """Every rank's ``x`` stacked on a new first axis: shape ``(world_size, *x.shape)``."""
        self._count("all_gather", x)
        return self._all_gather(x)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """``root``'s ``x``; other ranks pass an array of the same shape and dtype to fill."""
        self._count("broadcast", x)
        return self._broadcast(x, root)

    def barrier(self) -> None:
        """Return once every rank has called it."""
        self._count("barrier", None)
        self._barrier()

    @abstractmethod
    def _all_reduce(self, x: Any) -> Any: ...

    @abstractmethod
    def _all_gather(self, x: Any) -> Any: ...

    @abstractmethod
    def _broadcast(self, x: Any, root: int) -> Any: ...

    @abstractmethod
    def _barrier(self) -> None: ...

    def close(self) -> None:  # noqa: B027
        """Leave the group and free its sockets (the default holds nothing)."""

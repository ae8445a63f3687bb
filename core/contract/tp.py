"""The tensor-parallel contract an architecture implements: which slice of each weight a
rank loads, and the rank's graph over a communicator.

``Architecture.tensor_parallel`` returns a :class:`TensorParallelPlan`; the tensor-parallel
plugin (:mod:`tessera.plugins.tensor_parallel`) executes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from tessera.contract.comm import Communicator


@attrs.frozen
class Split:
    """Take ``[lo, hi)`` along ``axis`` of a tensor (numpy order: 0 = rows, 1 = columns).

    A 1-D tensor splits along its only axis (``axis`` 0). Rows past the end of the tensor
    read as zeros, so a plan can give every rank the same number of rows.
    """

    axis: int
    lo: int
    hi: int


class TensorParallelPlan(Protocol):
    """How one rank of ``world_size`` takes part in a model (returned by the architecture)."""

    #: The config of this rank's part (fewer heads, a narrower FFN): the KV cache layout
    #: and the backend's op probe use it.
    local_config: Any

    def shards(self, names: Iterable[str]) -> dict[str, tuple[str, Split | None]]:
        """For each weight this rank loads: ``local name -> (file tensor name, split)``.

        ``split`` None means the whole tensor (replicated); a file tensor left out is not
        loaded on this rank.
        """

    def build(self, weights: Mapping[str, Any], backend: Any, comm: Communicator) -> Any:
        """The rank's forward graph; it calls ``comm`` where partial results meet."""

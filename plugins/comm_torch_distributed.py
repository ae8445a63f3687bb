"""The ``torch-distributed`` communicator: torch.distributed process groups (gloo, NCCL).

Bootstrapped through a ``torch.distributed.TCPStore`` that rank 0 hosts at its address
and the port it announced in the rendezvous. NCCL is used when every rank offered it
(every rank on a CUDA device with NCCL built in); otherwise gloo, which works on CPU
tensors everywhere. The process group is created directly (``ProcessGroupGloo`` /
``ProcessGroupNCCL``), never as torch's global default group, so one process can hold
several groups (the tests do) and nothing outside this object changes.

Every wait is bounded by the group's timeout: a dead peer is reported at once by gloo
("connection closed by peer"); a hung one when the timeout passes.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import numpy as np

from tessera.contract.comm import (
    Communicator,
    CommunicatorError,
    CommunicatorInfo,
    CommunicatorProbe,
    GroupSpec,
)
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


class TorchDistributedCommunicator(Communicator):
    name = "torch-distributed"

    def __init__(self, spec: GroupSpec) -> None:
        import torch
        import torch.distributed as dist

        super().__init__(spec.rank, spec.world_size)
        self.torch = torch
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        self.timeout = timeout
        use_nccl = "nccl" in spec.features and spec.device.startswith("cuda")
        try:
            self.store = dist.TCPStore(
                spec.host,
                spec.port,
                spec.world_size,
                spec.rank == 0,
                timeout=timeout,
                wait_for_workers=False,
            )
            prefixed = dist.PrefixStore("tessera-tp/", self.store)
            if use_nccl:
                self.device = torch.device(spec.device)
                os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(prefixed, spec.rank, spec.world_size, opts)
                self.path = "nccl (every rank is on a CUDA device with NCCL)"
            else:
                self.device = torch.device("cpu")
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = timeout
                # Bind gloo to the address this rank used to reach rank 0, not to whatever
                # the hostname resolves to (often 127.0.1.1 in containers).
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=spec.local_host)]
                self.pg = dist.ProcessGroupGloo(prefixed, spec.rank, spec.world_size, opts)
                why = "cpu" if not spec.device.startswith("cuda") else "not every rank has nccl"
                self.path = f"gloo ({why})"
        except (RuntimeError, ValueError) as exc:
            raise CommunicatorError(
                f"torch-distributed: rank {spec.rank} could not join the group at "
                f"{spec.host}:{spec.port} ({_first_line(exc)})"
            ) from exc

    def _wait(self, work: Any, op: str) -> None:
        try:
            work.wait(self.timeout)
        except RuntimeError as exc:
            raise CommunicatorError(
                f"rank {self.rank}: {op} failed — another rank stopped, crashed or did not "
                f"answer within {self.timeout.total_seconds():g} s ({_first_line(exc)}); the "
                "tensor-parallel group is broken, restart every rank"
            ) from exc

    def _tensor(self, x: Any) -> tuple[Any, bool]:
        """A tensor on the group's device for ``x``, and whether ``x`` was numpy."""
        if isinstance(x, np.ndarray):
            return self.torch.from_numpy(np.ascontiguousarray(x)).to(self.device), True
        return x.contiguous().to(self.device), False

    def _back(self, t: Any, like: Any, was_numpy: bool) -> Any:
        return t.cpu().numpy() if was_numpy else t.to(like.device)

    def _all_reduce(self, x: Any) -> Any:
        t, was_numpy = self._tensor(x)
        self._wait(self.pg.allreduce([t]), "all_reduce")
        return self._back(t, x, was_numpy)

    def _all_gather(self, x: Any) -> Any:
        t, was_numpy = self._tensor(x)
        out = [self.torch.empty_like(t) for _ in range(self.world_size)]
        self._wait(self.pg.allgather([out], [t]), "all_gather")
        return self._back(self.torch.stack(out), x, was_numpy)

    def _broadcast(self, x: Any, root: int) -> Any:
        t, was_numpy = self._tensor(x)
        self._wait(self.pg.broadcast(t, root), "broadcast")
        return self._back(t, x, was_numpy)

    def _barrier(self) -> None:
        # A one-element all-reduce: bounded by the timeout, unlike some barrier impls.
        t = self.torch.zeros(1, device=self.device)
        self._wait(self.pg.allreduce([t]), "barrier")

    def close(self) -> None:
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except RuntimeError:
                pass
        self.pg = None
        self.store = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def probe(device: str) -> CommunicatorProbe:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return CommunicatorProbe(False, reason=f"torch is not installed ({exc})")
    if not dist.is_available():
        return CommunicatorProbe(False, reason="this torch build has no torch.distributed")
    features = []
    if dist.is_gloo_available():
        features.append("gloo")
    if device.startswith("cuda") and dist.is_nccl_available() and torch.cuda.is_available():
        features.append("nccl")
    if not features:
        return CommunicatorProbe(False, reason="torch.distributed has neither gloo nor nccl")
    return CommunicatorProbe(True, tuple(features))


def create(spec: GroupSpec) -> TorchDistributedCommunicator:
    comm = TorchDistributedCommunicator(spec)
    comm.barrier()  # the group is formed only once every rank answered
    return comm


@hookimpl
def tessera_register_communicators(register):
    register(
        CommunicatorInfo(
            "torch-distributed",
            create,
            probe,
            "torch.distributed process groups: NCCL on CUDA, gloo on CPU; TCPStore bootstrap",
            collective=True,
        )
    )

"""Starting a tensor-parallel run: ``--tp N`` spawns local ranks, ``--tp-rank`` joins a group.

``tessera run --tp N`` (no ``--tp-rank``) makes this process rank 0, picks a free
loopback port and spawns ranks 1..N-1 as local processes (multiprocessing ``spawn``),
each with ``cpu_count // N`` threads unless ``-t`` is given. ``--tp-rank R --tp-master
HOST:PORT`` starts one rank of a group spread over machines: rank 0 listens at
HOST:PORT, the others connect there; rank 0 drives generation and the others serve
until it stops (see :mod:`tessera.plugins.tensor_parallel.lockstep`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from typing import Any

import attrs

from tessera.contract.comm import COMMUNICATOR_ENV, DEFAULT_TIMEOUT_S, CommunicatorError
from tessera.errors import TesseraError
from tessera.plugins.tensor_parallel.lockstep import TPContext, serve_worker
from tessera.plugins.tensor_parallel.ports import free_port
from tessera.plugins.tensor_parallel.shard import (
    REPLICATE_LM_HEAD,
    attach,
    form_group,
    load_model_shard,
)

#: The tensor-parallel switches (registered by the ``run`` command, which launches ranks).
SWITCHES = (REPLICATE_LM_HEAD,)


def add_tp_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("tensor parallel")
    g.add_argument("--tp", type=int, default=1, metavar="N", help="ranks to split the model over")
    g.add_argument(
        "--tp-rank",
        type=int,
        default=None,
        metavar="R",
        help="join a group as rank R (with --tp-master); without it --tp spawns local ranks",
    )
    g.add_argument(
        "--tp-master", default=None, metavar="HOST:PORT", help="rank 0's rendezvous address"
    )
    g.add_argument(
        "--communicator",
        default=None,
        metavar="NAME",
        help=f"torch-distributed or pairwise (default: the best every rank has; also "
        f"{COMMUNICATOR_ENV})",
    )
    g.add_argument(
        "--tp-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for another rank before stopping with an error",
    )


def tp_requested(args: argparse.Namespace) -> bool:
    return getattr(args, "tp", 1) > 1 or getattr(args, "tp_rank", None) is not None


@attrs.frozen
class RankSpec:
    """What a rank needs to load its shard and join (picklable, for spawned ranks)."""

    model: str
    rank: int
    world_size: int
    master: str
    communicator: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    threads: int = 0


def _default_device(spec: RankSpec) -> str | None:
    """With no --device on a machine with several GPUs, rank r takes GPU r mod count
    (NCCL needs one GPU per rank); otherwise the backend's own choice."""
    if spec.device is not None or spec.backend not in (None, "torch"):
        return spec.device
    try:
        import torch
    except ImportError:
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cuda:{spec.rank % count}" if count > 1 else None


def _load_and_join(spec: RankSpec, runtime: Any) -> tuple[Any, Any]:
    shard = load_model_shard(
        spec.model,
        runtime,
        spec.rank,
        spec.world_size,
        spec.backend,
        device=_default_device(spec),
        dtype=spec.dtype,
    )
    if spec.threads > 0:
        shard.model.backend.set_threads(spec.threads)
    group = form_group(
        runtime, shard, spec.master, communicator=spec.communicator, timeout_s=spec.timeout_s
    )
    return attach(shard, group.comm), group


def run_worker(spec: RankSpec, runtime: Any = None) -> int:
    """A rank other than 0: load, join, repeat rank 0's work until it stops; exit code."""
    from tessera.plugin_manager import Runtime

    runtime = runtime or Runtime()
    model, group = _load_and_join(spec, runtime)
    try:
        serve_worker(model, group.comm)
    finally:
        group.comm.close()
    return 0


def _spawned_worker(spec: RankSpec) -> None:
    """Entry of a locally spawned rank: errors become one line on stderr and exit 1."""
    try:
        code = run_worker(spec)
    except TesseraError as exc:
        print(f"error: rank {spec.rank}: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    os._exit(code)  # skip interpreter teardown of torch's process-group threads


class TPSession:
    """Rank 0 of a group: its model, the group's communicator and any spawned ranks."""

    def __init__(self, spec: RankSpec, runtime: Any, processes: list[Any]) -> None:
        self.processes = processes
        try:
            self.model, self.group = _load_and_join(spec, runtime)
        except BaseException:
            self._stop_processes()
            raise
        self.comm = self.group.comm
        self.context: TPContext | None = None

    @property
    def describe(self) -> str:
        a = self.group.answer
        return f"tp {self.comm.world_size} via {a['communicator']} ({self.comm.path})"

    def make_context(self, params: Any) -> TPContext:
        self.context = TPContext(self.model, params, self.comm)
        return self.context

    def _stop_processes(self, timeout: float = 5.0) -> None:
        for p in self.processes:
            p.join(timeout)
            if p.is_alive():
                p.terminate()
                p.join(timeout)

    def close(self, ok: bool = True) -> None:
        """Stop the other ranks (cleanly when ``ok``), leave the group, reap local ranks."""
        try:
            if ok and self.context is not None:
                self.context.stop()
        except CommunicatorError:
            ok = False
        finally:
            self.comm.close()
            self._stop_processes(timeout=10.0 if ok else 1.0)
        failed = [p for p in self.processes if p.exitcode not in (0, None)]
        if ok and failed:
            raise CommunicatorError(
                f"local rank(s) exited with code {', '.join(str(p.exitcode) for p in failed)}"
            )


def _check_before_spawning(spec: RankSpec, runtime: Any) -> None:
    """Refuse what rank 0 can see alone (an unknown communicator, heads that do not
    divide) before any other rank starts, so the error is printed once."""
    from tessera.plugins.tensor_parallel.shard import read_model_file

    known = runtime.communicators()
    if spec.communicator is not None and spec.communicator not in known:
        raise CommunicatorError(
            f"unknown communicator '{spec.communicator}'; the installed communicators are: "
            + (", ".join(sorted(known)) or "none")
        )
    gguf = read_model_file(spec.model)
    arch = runtime.architecture(gguf.architecture)
    shapes = {name: t.shape for name, t in gguf.tensors.items()}
    arch.tensor_parallel(arch.config_from_gguf(gguf.metadata, shapes), 0, spec.world_size)


def start(args: argparse.Namespace, runtime: Any) -> TPSession | int:
    """From ``tessera run`` flags: a :class:`TPSession` on rank 0, or (other ranks) serve
    until rank 0 stops and return the exit code."""
    from tessera.files.load import default_model_path

    if args.tp < 1:
        raise TesseraError(f"--tp must be at least 1, got {args.tp}")
    rank = args.tp_rank
    if rank is not None and not 0 <= rank < args.tp:
        raise TesseraError(f"--tp-rank must be in [0, {args.tp}), got {rank}")
    if rank is not None and args.tp_master is None:
        raise TesseraError("--tp-rank needs --tp-master HOST:PORT (rank 0's address)")
    master = args.tp_master or f"127.0.0.1:{free_port('127.0.0.1')}"
    threads = args.threads
    if threads <= 0 and rank is None:  # local ranks share this machine's cores
        threads = max(1, (os.cpu_count() or 1) // args.tp)
    base = RankSpec(
        model=str(args.model or default_model_path()),
        rank=0,
        world_size=args.tp,
        master=master,
        communicator=args.communicator,
        timeout_s=args.tp_timeout,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        threads=threads,
    )
    if rank is not None and rank > 0:
        return run_worker(attrs.evolve(base, rank=rank), runtime)
    _check_before_spawning(base, runtime)
    processes = []
    if rank is None:
        mp = multiprocessing.get_context("spawn")
        for r in range(1, args.tp):
            p = mp.Process(target=_spawned_worker, args=(attrs.evolve(base, rank=r),), daemon=True)
            p.start()
            processes.append(p)
    return TPSession(base, runtime, processes)

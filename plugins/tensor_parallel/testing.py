"""Running a tensor-parallel group inside a test: N spawned ranks on free loopback ports.

:func:`run_group` starts ``world_size`` processes (multiprocessing ``spawn``; torch
limited to one thread each by ``OMP_NUM_THREADS``) that call
``target(rank, world_size, master, *args)``, and returns what each returned, or the
error each raised (as :class:`RankError`), in rank order. :func:`check_communicator` is
the communicator conformance kit: every collective against numpy, for a plugin
author's own communicator::

    results = run_group(2, check_communicator, "my-communicator")
    assert all(r == "ok" for r in results)

:func:`generate_rank` loads a model shard, forms the group and (rank 0) returns logits
of a prompt and greedy tokens, the other ranks serve — the parity tests' workhorse.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class RankError:
    """What a rank raised: the exception's type name and message."""

    rank: int
    type: str
    message: str


def _rank_main(target: Callable, rank: int, world_size: int, master: str, args: tuple, q) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # one thread per rank, read when torch loads
    try:
        result = target(rank, world_size, master, *args)
    except BaseException as exc:  # reported to the test, which decides what is expected
        msg = str(exc) or traceback.format_exc()
        result = RankError(rank, type(exc).__name__, msg)
    q.put((rank, result))
    q.close()
    q.join_thread()
    os._exit(0)  # skip interpreter teardown of torch's process-group threads


@attrs.define
class Group:
    """Spawned ranks and the queue their results arrive on."""

    processes: list[Any]
    results: Any
    master: str

    def collect(self, timeout_s: float = 120.0) -> list[Any]:
        """Results in rank order; a rank silent for ``timeout_s`` is killed and reported as
        a :class:`RankError` of type ``Timeout``."""
        n = len(self.processes)
        results: list[Any] = [RankError(r, "Timeout", "no result") for r in range(n)]
        pending = set(range(n))
        deadline = time.monotonic() + timeout_s
        try:
            while pending and time.monotonic() < deadline:
                try:
                    rank, result = self.results.get(timeout=0.2)
                except queue.Empty:
                    # A rank that exited without a result (killed) is not waited for.
                    for r in [r for r in pending if self.processes[r].exitcode is not None]:
                        results[r] = RankError(r, "Exited", f"code {self.processes[r].exitcode}")
                        pending.discard(r)
                    continue
                results[rank] = result
                pending.discard(rank)
                deadline = time.monotonic() + timeout_s
        finally:
            for p in self.processes:
                p.join(5.0)
                if p.is_alive():
                    p.kill()
                    p.join()
        return results


def start_group(
    world_size: int, target: Callable[..., Any], *args: Any, env: dict[str, str] | None = None
) -> Group:
    """Spawn ``world_size`` ranks running ``target(rank, world_size, master, *args)``.

    ``env`` is set in the parent while the ranks start (spawned children inherit it).
    """
    from tessera.plugins.tensor_parallel.ports import free_port

    master = f"127.0.0.1:{free_port('127.0.0.1')}"
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        procs = [
            ctx.Process(target=_rank_main, args=(target, r, world_size, master, args, q))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Group(procs, q, master)


def run_group(
    world_size: int,
    target: Callable[..., Any],
    *args: Any,
    timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``target`` on ``world_size`` spawned ranks; their results in rank order."""
    return start_group(world_size, target, *args, env=env).collect(timeout_s)


def check_communicator(rank: int, world_size: int, master: str, name: str) -> str:
    """Conformance: every collective of communicator ``name`` against numpy; "ok" or raises."""
    import torch

    from tessera.contract.comm import GroupSpec
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.rendezvous import rendezvous

    host, port = master.rsplit(":", 1)
    info = Runtime().communicators()[name]
    answer, local = rendezvous(
        rank, world_size, host, int(port), {}, 30.0, lambda caps: {"port": _port(host)}
    )
    spec = GroupSpec(rank, world_size, host, int(answer["port"]), 30.0, "cpu", ("gloo", "tcp"))
    comm = info.create(attrs.evolve(spec, local_host=local))
    try:
        rng = [np.random.default_rng(r) for r in range(world_size)]
        mine = [g.standard_normal((3, 5)).astype(np.float32) for g in rng]
        expect = mine[0].copy()
        for other in mine[1:]:
            expect = expect + other
        got = comm.all_reduce(mine[rank].copy())
        assert isinstance(got, np.ndarray) and got.shape == (3, 5), got
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6)
        t = torch.from_numpy(mine[rank]).to(torch.bfloat16)
        got_t = comm.all_reduce(t.clone())
        assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.bfloat16
        bf = [torch.from_numpy(m).to(torch.bfloat16).float() for m in mine]
        np.testing.assert_allclose(got_t.float().numpy(), sum(bf).numpy(), rtol=2e-2, atol=2e-2)
        gathered = comm.all_gather(np.full((2,), rank, dtype=np.int64))
        assert gathered.shape == (world_size, 2)
        assert gathered[:, 0].tolist() == list(range(world_size)), gathered
        root = world_size - 1
        sent = np.arange(6, dtype=np.int32) * (root + 1)
        got_b = comm.broadcast(sent.copy() if rank == root else np.zeros(6, np.int32), root)
        assert got_b.tolist() == sent.tolist(), got_b
        comm.barrier()
        assert comm.stats["all_reduce"][0] == 2
        assert comm.stats["all_reduce"][1] == mine[rank].nbytes + t.numel() * 2
    finally:
        comm.close()
    return "ok"


def _port(host: str) -> int:
    from tessera.plugins.tensor_parallel.ports import free_port

    return free_port(host)


def generate_rank(
    rank: int,
    world_size: int,
    master: str,
    model_path: str,
    prompt: Sequence[int],
    n_predict: int,
    communicator: str | None = None,
    timeout_s: float = 30.0,
    split_lm_head: bool = True,
    progress: Any = None,
) -> Any:
    """One rank of a parity run on the torch backend in f32.

    Rank 0 returns ``(prompt logits (all rows), greedy tokens, communicator name,
    all-reduce stats)``; the others serve and return the number of decodes they ran.
    ``progress`` (a queue) receives each token rank 0 generates, for fault tests.
    """
    from tessera.engine.batch import Batch
    from tessera.engine.context import ContextParams
    from tessera.engine.generate import generate
    from tessera.engine.sampling import Sampler, SamplerParams
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.lockstep import TPContext, serve_worker
    from tessera.plugins.tensor_parallel.shard import attach, form_group, load_model_shard

    runtime = Runtime()
    shard = load_model_shard(
        model_path, runtime, rank, world_size, "torch", dtype="f32", split_lm_head=split_lm_head
    )
    group = form_group(runtime, shard, master, communicator=communicator, timeout_s=timeout_s)
    model = attach(shard, group.comm)
    try:
        if rank != 0:
            return serve_worker(model, group.comm)
        ctx = TPContext(model, ContextParams(n_ctx=256, n_ubatch=8), group.comm)
        logits = ctx.decode(Batch.for_sequence(list(prompt), 0, 0, "all"))
        ctx.kv.seq_rm(0)
        tokens = []
        sampler = Sampler(SamplerParams(temperature=0.0))
        for token in generate(ctx, list(prompt), n_predict, sampler):
            tokens.append(int(token))
            if progress is not None:
                progress.put(len(tokens))
        ctx.stop()
        return logits, tokens, group.answer["communicator"], dict(group.comm.stats)
    finally:
        group.comm.close()

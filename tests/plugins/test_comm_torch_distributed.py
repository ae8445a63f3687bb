"""The torch-distributed communicator (gloo here): collectives against numpy, faults."""

import numpy as np
import pytest

from tessera.plugins.tensor_parallel.testing import RankError, check_communicator, run_group


@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_collectives_match_numpy(world_size):
    results = run_group(world_size, check_communicator, "torch-distributed", timeout_s=90)
    assert results == ["ok"] * world_size


def _join(rank, world_size, master, timeout_s):
    from tessera.contract.comm import GroupSpec
    from tessera.plugins.comm_torch_distributed import create

    host, port = master.rsplit(":", 1)
    return create(GroupSpec(rank, world_size, host, int(port), timeout_s, "cpu", ("gloo",)))


def _one_dies(rank, world_size, master):
    import os

    comm = _join(rank, world_size, master, 20.0)
    if rank == 1:
        os._exit(3)  # a crash: no goodbye
    return comm.all_reduce(np.ones(4, dtype=np.float32))


def test_a_crashed_peer_ends_the_collective_with_an_error():
    results = run_group(2, _one_dies, timeout_s=60)
    assert isinstance(results[0], RankError) and results[0].type == "CommunicatorError"
    assert "all_reduce failed" in results[0].message


def _one_hangs(rank, world_size, master):
    import time

    comm = _join(rank, world_size, master, 2.0)
    if rank == 1:
        time.sleep(5.0)
        return "slept"
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, dtype=np.float32))
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - t0
    return "no error"


def test_a_hung_peer_is_reported_after_the_timeout():
    kind, message, waited = run_group(2, _one_hangs, timeout_s=60)[0]
    assert kind == "CommunicatorError" and "within 2 s" in message
    assert 1.5 < waited < 4.5


def test_probe_offers_gloo_on_cpu_and_no_nccl():
    from tessera.plugins.comm_torch_distributed import probe

    answer = probe("cpu")
    assert answer.usable and "gloo" in answer.features and "nccl" not in answer.features

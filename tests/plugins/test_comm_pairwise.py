"""The pairwise communicator: every collective against numpy, and its failure modes."""

import numpy as np

from tessera.plugins.tensor_parallel.testing import RankError, check_communicator, run_group


def test_pairwise_collectives_match_numpy():
    assert run_group(2, check_communicator, "pairwise", timeout_s=60) == ["ok", "ok"]


def _join(rank, world_size, master, timeout_s):
    from tessera.contract.comm import GroupSpec
    from tessera.plugins.comm_pairwise import create

    host, port = master.rsplit(":", 1)
    return create(GroupSpec(rank, world_size, host, int(port), timeout_s))


def _mismatched(rank, world_size, master):
    comm = _join(rank, world_size, master, 10.0)
    x = np.ones(4, dtype=np.float32)
    return comm.all_reduce(x) if rank == 0 else comm.all_gather(x)


def test_ranks_calling_different_collectives_are_told_so():
    results = run_group(2, _mismatched, timeout_s=60)
    assert all(isinstance(r, RankError) for r in results), results
    assert "rank 1 called all_gather #2 where this rank called all_reduce #2" in results[0].message


def _one_leaves(rank, world_size, master):
    comm = _join(rank, world_size, master, 10.0)
    if rank == 1:
        comm.close()
        return "left"
    return comm.all_reduce(np.ones(4, dtype=np.float32))


def test_a_peer_that_leaves_ends_the_collective_with_an_error():
    results = run_group(2, _one_leaves, timeout_s=60)
    assert results[1] == "left"
    assert isinstance(results[0], RankError) and results[0].type == "CommunicatorError"
    assert "rank 1" in results[0].message and "restart every rank" in results[0].message


def _one_hangs(rank, world_size, master):
    import time

    comm = _join(rank, world_size, master, 1.5)
    if rank == 1:
        time.sleep(4.0)
        return "slept"
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4, dtype=np.float32))
    except Exception as exc:
        return type(exc).__name__, str(exc), time.monotonic() - t0
    return "no error"


def test_a_hung_peer_is_reported_after_the_timeout():
    results = run_group(2, _one_hangs, timeout_s=60)
    kind, message, waited = results[0]
    assert kind == "CommunicatorError" and "within 1.5 s" in message
    assert 1.4 < waited < 3.5


def test_more_than_two_ranks_are_refused():
    from tessera.contract.comm import CommunicatorError, GroupSpec
    from tessera.plugins.comm_pairwise import create

    try:
        create(GroupSpec(0, 3, "127.0.0.1", 1, 1.0))
    except CommunicatorError as exc:
        assert "exactly two ranks, not 3" in str(exc)
    else:
        raise AssertionError("a 3-rank pairwise group was accepted")

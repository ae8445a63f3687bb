"""The rendezvous on rank 0's TCPStore: answers, refusals and timeouts, ranks on threads."""

import socket
import threading
import time

import pytest

from tessera.contract.comm import CommunicatorError
from tessera.plugins.tensor_parallel import rendezvous as rdv
from tessera.plugins.tensor_parallel.ports import free_port

HOST = "127.0.0.1"


def _run(port, joiners, timeout_s=10.0, decide=lambda caps: {"caps": caps}):
    """Run each ``(rank, world_size)`` or ``(rank, hello)`` joiner on its own thread against
    ``port``; what each returned, or the message it raised, in the joiners' order."""
    results = [None] * len(joiners)

    def one(i, rank, arg):
        try:
            if isinstance(arg, dict):
                results[i] = rdv._join(HOST, port, arg, timeout_s)
            else:
                results[i] = rdv.rendezvous(rank, arg, HOST, port, {"r": rank}, timeout_s, decide)
        except CommunicatorError as exc:
            results[i] = str(exc)

    threads = [threading.Thread(target=one, args=(i, *j)) for i, j in enumerate(joiners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 3 * rdv.GRACE_S)
    return results


def test_every_rank_gets_the_answer_rank_0_decided_on_all_caps_in_rank_order():
    port = free_port(HOST)
    results = _run(port, [(2, 3), (0, 3), (1, 3)])
    answer = {"caps": [{"r": 0}, {"r": 1}, {"r": 2}]}
    assert results == [(answer, HOST), (answer, HOST), (answer, HOST)]


def test_a_peer_started_with_another_tp_size_is_refused_on_both_sides():
    port = free_port(HOST)
    rank_0, peer = _run(port, [(0, 2), (1, 3)])
    assert rank_0 == f"the peer at {HOST} was started with --tp 3, not 2"
    assert peer == "rank 0 refused the peer: it was started with --tp 3, not 2"


def test_a_peer_of_another_rendezvous_version_is_refused_on_both_sides():
    port = free_port(HOST)
    hello = {"magic": rdv.MAGIC, "version": rdv.VERSION + 1, "rank": 1, "world_size": 2}
    rank_0, peer = _run(port, [(0, 2), (1, {**hello, "caps": {}})])
    assert rank_0 == f"the peer at {HOST} is not a tessera rank of this protocol version"
    assert peer == "rank 0 refused the peer: it is not a tessera rank of this protocol version"


def test_a_rank_that_is_taken_twice_is_refused_to_every_rank():
    port = free_port(HOST)
    rank_0, *peers = _run(port, [(0, 3), (1, 3), (1, 3)])
    problem = "claims rank 1, which is out of range or taken"
    assert rank_0 == f"the peer at {HOST} {problem}"
    assert peers == [f"rank 0 refused the peer: it {problem}"] * 2


def test_a_rank_that_never_arrives_is_named_to_every_rank_that_did_within_the_timeout():
    port = free_port(HOST)
    start = time.monotonic()
    rank_0, rank_1 = _run(port, [(0, 3), (1, 3)], timeout_s=1.0)
    assert time.monotonic() - start < 1.0 + 2 * rdv.GRACE_S
    expected = f"rank(s) 2 did not join {HOST}:{port} within 1 s; start them with --tp-master"
    assert rank_0.startswith(expected)
    assert rank_0 == rank_1


def test_a_master_that_accepts_but_never_answers_is_reported_after_the_timeout():
    with socket.create_server((HOST, 0)) as silent:  # the kernel accepts; nobody answers
        port = silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(CommunicatorError, match="accepted the connection but did not answer"):
            rdv.rendezvous(1, 2, HOST, port, {}, 0.5, None)
        assert time.monotonic() - start < 0.5 + 3 * rdv.GRACE_S

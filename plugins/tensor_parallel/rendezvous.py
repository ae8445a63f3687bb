"""Rendezvous: ranks find rank 0 and exchange capabilities before any communicator starts.

Rank 0 hosts a ``torch.distributed.TCPStore`` at ``--tp-master host:port``. Every other
rank connects once it listens (waiting up to the timeout), takes the next arrival slot
(``add(JOINED, 1)``) and sets its hello ``{"magic", "version", "rank", "world_size",
"host", "caps"}`` under ``HELLO + slot``. Rank 0 waits for slots 1 to ``world_size - 1``
in turn and checks each hello as it arrives, so a stray peer, another ``--tp`` size or a
rank taken twice is refused whatever rank it claims. It calls ``decide`` with every
rank's caps (rank order) and sets one ``ANSWER`` that every rank waits for:
``{"ranks": world_size, "answer": ...}``, or ``{"error": message}`` so that every rank
stops with the same sentence. Each rank acknowledges under ``READ + slot``; rank 0 keeps
the store up until all have. Values are plain JSON (never pickle): nothing a peer sends
is executed.
"""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time
from collections.abc import Callable, Container
from typing import Any, TypeVar

from tessera.contract.comm import CommunicatorError
from tessera.errors import TesseraError

MAGIC = "tessera-tp"
VERSION = 2
#: Seconds rank 0 keeps the store up for ranks to read its error, and that the other ranks
#: wait past their own timeout so that they hear rank 0's reason rather than a silence.
GRACE_S = 2.0

T = TypeVar("T")

JOINED = f"{MAGIC}/joined"  # the arrival counter: add(JOINED, 1) is a rank's slot
ANSWER = f"{MAGIC}/answer"
HELLO = f"{MAGIC}/hello/"  # + slot
READ = f"{MAGIC}/read/"  # + slot


def _dist() -> Any:
    import torch.distributed as dist

    if not dist.is_available():
        raise CommunicatorError(
            "this torch build has no torch.distributed, whose TCPStore the tensor-parallel "
            "rendezvous uses; install a torch build with distributed support"
        )
    return dist


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _seconds(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(s, 0.0))


def _wait_json(store: Any, key: str, until: float) -> dict[str, Any] | None:
    """The JSON object under ``key`` once it is set ({} if it is not one), None at ``until``."""
    try:
        store.wait([key], _seconds(until - time.monotonic()))
    except _dist().DistStoreError:
        return None
    try:
        value = json.loads(store.get(key))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _refusal(hello: dict[str, Any], world_size: int, taken: Container[int]) -> str | None:
    rank = hello.get("rank")
    if hello.get("magic") != MAGIC or hello.get("version") != VERSION or "caps" not in hello:
        return "is not a tessera rank of this protocol version"
    if hello.get("world_size") != world_size:
        return f"was started with --tp {hello.get('world_size')}, not {world_size}"
    if not isinstance(rank, int) or not 0 < rank < world_size or rank in taken:
        return f"claims rank {rank}, which is out of range or taken"
    return None


class _Refused(CommunicatorError):
    """A peer rank 0 turned away; ``told`` is the sentence the ranks waiting get."""

    def __init__(self, message: str, told: str) -> None:
        super().__init__(message)
        self.told = told


def _announce(store: Any, message: dict[str, Any], until: float) -> list[int]:
    """Set the answer for every rank that joined; the slots that have not read it by ``until``."""
    store.set(ANSWER, json.dumps(message))
    slots = range(1, store.add(JOINED, 0) + 1)
    try:
        store.wait([f"{READ}{s}" for s in slots], _seconds(until - time.monotonic()))
    except _dist().DistStoreError:
        return [s for s in slots if not store.check([f"{READ}{s}"])]
    return []


def _master_store(host: str, port: int, timeout_s: float) -> Any:
    dist = _dist()
    try:
        listener = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise CommunicatorError(
            f"rank 0 cannot listen on {host}:{port} ({exc.strerror or exc}); --tp-master must "
            "name an address of rank 0's machine and a free port"
        ) from exc
    try:
        # Handed our socket, the store listens on --tp-master's address, not every interface.
        fd = listener.detach()
        timeout = _seconds(timeout_s)
        return dist.TCPStore(
            host, port, None, True, timeout=timeout, wait_for_workers=False, master_listen_fd=fd
        )
    except dist.DistError as exc:
        raise CommunicatorError(
            f"rank 0 cannot start the rendezvous store on {host}:{port} ({_first_line(exc)})"
        ) from exc


def _admit(
    store: Any, host: str, port: int, world_size: int, timeout_s: float, deadline: float
) -> dict[int, dict[str, Any]]:
    """The hellos of ranks 1 .. world_size - 1 by arrival slot, each checked as it arrives."""
    hellos: dict[int, dict[str, Any]] = {}
    for slot in range(1, world_size):
        hello = _wait_json(store, f"{HELLO}{slot}", deadline)
        if hello is None:
            arrived = {h["rank"] for h in hellos.values()}
            missing = ", ".join(str(r) for r in range(1, world_size) if r not in arrived)
            raise CommunicatorError(
                f"rank(s) {missing} did not join {host}:{port} within {timeout_s:g} s; start "
                f"them with --tp-master {host}:{port} or raise --tp-timeout"
            )
        problem = _refusal(hello, world_size, {h["rank"] for h in hellos.values()})
        if problem:
            peer = hello.get("host")
            peer = f"the peer at {peer}" if isinstance(peer, str) else "a peer"
            raise _Refused(f"{peer} {problem}", f"rank 0 refused the peer: it {problem}")
        hellos[slot] = hello
    return hellos


def _serve(
    host: str,
    port: int,
    world_size: int,
    caps: dict[str, Any],
    timeout_s: float,
    decide: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    store = _master_store(host, port, timeout_s)  # it stops listening when dropped
    deadline = time.monotonic() + timeout_s
    try:
        hellos = _admit(store, host, port, world_size, timeout_s, deadline)
        ranked = sorted(hellos.values(), key=lambda h: h["rank"])
        answer = decide([caps] + [h["caps"] for h in ranked])
    except TesseraError as exc:
        told = exc.told if isinstance(exc, _Refused) else str(exc)
        _announce(store, {"error": told}, time.monotonic() + GRACE_S)
        raise
    until = max(deadline, time.monotonic() + GRACE_S)
    unread = _announce(store, {"ranks": world_size, "answer": answer}, until)
    if any(s in hellos for s in unread):
        ranks = ", ".join(str(hellos[s]["rank"]) for s in unread if s in hellos)
        raise CommunicatorError(
            f"rank(s) {ranks} stopped during rendezvous (joined but did not read rank 0's "
            "answer); restart every rank"
        )
    return answer


def _reach(host: str, port: int, deadline: float, timeout_s: float) -> str:
    """Wait until rank 0 listens; the local address this rank reaches it from."""
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror as exc:
        raise CommunicatorError(
            f"cannot resolve --tp-master host '{host}' ({exc.strerror}); give rank 0's address"
        ) from exc
    # A plain connect, because TCPStore logs a C++ stack trace at every retry of its own.
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommunicatorError(
                f"no rank 0 answered at {host}:{port} within {timeout_s:g} s ({last}); check "
                "--tp-master and that rank 0 is running"
            )
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)) as probe:
                return str(probe.getsockname()[0])
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(min(0.1, max(left, 0)))


def _exchange(
    host: str, port: int, hello: dict[str, Any], until: float
) -> tuple[dict[str, Any], int]:
    """Post ``hello`` to rank 0's store; rank 0's reply and this rank's arrival slot."""
    dist = _dist()
    where = f"rank 0 at {host}:{port}"
    try:
        store = dist.TCPStore(host, port, None, False, timeout=_seconds(until - time.monotonic()))
        slot = store.add(JOINED, 1)
        store.set(f"{HELLO}{slot}", json.dumps(hello))
        reply = _wait_json(store, ANSWER, until)
        if reply is None:
            raise CommunicatorError(
                f"{where} did not answer in time; it waits for all {hello['world_size']} "
                f"ranks to join — start every rank with --tp-master {host}:{port} or raise "
                "--tp-timeout"
            )
        store.set(f"{READ}{slot}", "")
    except dist.DistError as exc:
        raise CommunicatorError(
            f"lost {where} during rendezvous ({_first_line(exc)}); see rank 0's error and "
            "restart every rank"
        ) from exc
    return reply, slot


def _within(until: float, call: Callable[[], T], late: str) -> T:
    """``call()`` on a daemon thread, or ``CommunicatorError(late)`` once ``until`` passes.

    TCPStore's client blocks without a timeout on a master that accepts a connection and
    never answers (a hung rank 0, another service on the port); its thread is left behind.
    """
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # re-raised in the calling thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="tessera-tp-rendezvous", daemon=True)
    thread.start()
    thread.join(max(until - time.monotonic(), 0))
    if not outcome:
        raise CommunicatorError(late)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def _join(
    host: str, port: int, hello: dict[str, Any], timeout_s: float
) -> tuple[dict[str, Any], str]:
    _dist()  # imported before the clock starts: a first import takes seconds
    deadline = time.monotonic() + timeout_s
    local_host = _reach(host, port, deadline, timeout_s)
    hello = {**hello, "host": local_host}
    until = deadline + GRACE_S
    late = (
        f"rank 0 at {host}:{port} accepted the connection but did not answer within "
        f"{timeout_s:g} s; it hangs, or --tp-master names another service — check it and "
        "restart every rank"
    )
    reply, slot = _within(until + GRACE_S, lambda: _exchange(host, port, hello, until), late)
    if "answer" not in reply:  # rank 0's error, or a store that is not tessera's
        stray = f"the store at {host}:{port} is not a tessera rank 0's; check --tp-master"
        raise CommunicatorError(str(reply.get("error", stray)))
    if slot >= reply["ranks"]:
        raise CommunicatorError(
            f"rank 0 at {host}:{port} formed its group of {reply['ranks']} ranks without this "
            "one; start each rank once, with the same --tp and its own --tp-rank"
        )
    return reply["answer"], local_host


def rendezvous(
    rank: int,
    world_size: int,
    host: str,
    port: int,
    caps: dict[str, Any],
    timeout_s: float,
    decide: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> tuple[dict[str, Any], str]:
    """Exchange ``caps`` with the other ranks; return rank 0's answer and this rank's address.

    Only rank 0 calls ``decide`` (with every rank's caps); the others receive its result.
    The address is the one this rank reaches rank 0 from (rank 0: ``host``).
    """
    if rank == 0:
        return _serve(host, port, world_size, caps, timeout_s, decide), host
    hello = {"magic": MAGIC, "version": VERSION, "rank": rank, "world_size": world_size}
    return _join(host, port, {**hello, "caps": caps}, timeout_s)

"""Rendezvous: ranks find rank 0 and exchange capabilities before any communicator starts.

Rank 0 listens on ``--tp-master host:port``; every other rank connects (retrying until
the timeout) and sends one JSON line ``{"magic", "version", "rank", "world_size",
"caps"}``. When all ``world_size - 1`` ranks have arrived, rank 0 calls ``decide`` with
every rank's caps (rank order) and sends its answer, one JSON line, to each rank; an
exception in ``decide`` is sent as ``{"error": message}`` so every rank stops with the
same sentence. Plain JSON (never pickle): nothing a peer sends is executed.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from tessera.contract.comm import CommunicatorError
from tessera.errors import TesseraError

MAGIC = "tessera-tp"
VERSION = 1
#: Longest JSON line accepted from a peer (caps are small).
MAX_LINE = 1 << 20


def _read_line(sock: socket.socket, deadline: float, peer: str) -> dict[str, Any]:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommunicatorError(f"{peer} sent nothing within the timeout during rendezvous")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError as exc:
            raise CommunicatorError(f"{peer} dropped the connection in rendezvous ({exc})") from exc
        if not chunk:
            raise CommunicatorError(f"{peer} closed the connection during rendezvous")
        buf += chunk
        if len(buf) > MAX_LINE:
            raise CommunicatorError(f"{peer} sent an oversized rendezvous message")
    try:
        return json.loads(buf)
    except ValueError as exc:
        raise CommunicatorError(f"{peer} is not a tessera rank (bad rendezvous message)") from exc


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _serve(
    host: str,
    port: int,
    world_size: int,
    caps: dict[str, Any],
    timeout_s: float,
    decide: Callable[[list[dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    try:
        server = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        raise CommunicatorError(
            f"rank 0 cannot listen on {host}:{port} ({exc.strerror or exc}); --tp-master must "
            "name an address of rank 0's machine and a free port"
        ) from exc
    peers: dict[int, socket.socket] = {}
    all_caps: list[dict[str, Any] | None] = [caps] + [None] * (world_size - 1)
    try:
        while len(peers) < world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [str(r) for r in range(1, world_size) if r not in peers]
                raise CommunicatorError(
                    f"rank(s) {', '.join(missing)} did not join {host}:{port} within "
                    f"{timeout_s:g} s; start them with --tp-master {host}:{port} or raise "
                    "--tp-timeout"
                )
            server.settimeout(left)
            try:
                conn, addr = server.accept()
            except TimeoutError:
                continue
            hello = _read_line(conn, deadline, f"the peer at {addr[0]}")
            rank = hello.get("rank")
            problem = None
            if hello.get("magic") != MAGIC or hello.get("version") != VERSION:
                problem = "is not a tessera rank of this protocol version"
            elif hello.get("world_size") != world_size:
                problem = f"was started with --tp {hello.get('world_size')}, not {world_size}"
            elif not isinstance(rank, int) or not 0 < rank < world_size or rank in peers:
                problem = f"claims rank {rank}, which is out of range or taken"
            if problem:
                _send(conn, {"error": f"rank 0 refused the peer: it {problem}"})
                conn.close()
                raise CommunicatorError(f"the peer at {addr[0]} {problem}")
            peers[rank] = conn
            all_caps[rank] = hello["caps"]
        try:
            answer = decide(all_caps)  # type: ignore[arg-type]
        except TesseraError as exc:
            for conn in peers.values():
                _send(conn, {"error": str(exc)})
            raise
        for conn in peers.values():
            _send(conn, answer)
        return answer
    finally:
        for conn in peers.values():
            conn.close()
        server.close()


def _join(
    host: str, port: int, rank: int, world_size: int, caps: dict[str, Any], timeout_s: float
) -> tuple[dict[str, Any], str]:
    deadline = time.monotonic() + timeout_s
    try:
        socket.getaddrinfo(host, port)
    except socket.gaierror as exc:
        raise CommunicatorError(
            f"cannot resolve --tp-master host '{host}' ({exc.strerror}); give rank 0's address"
        ) from exc
    last = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CommunicatorError(
                f"no rank 0 answered at {host}:{port} within {timeout_s:g} s ({last}); check "
                "--tp-master and that rank 0 is running"
            )
        try:
            sock = socket.create_connection((host, port), timeout=min(left, 5.0))
            break
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(min(0.1, max(left, 0)))
    try:
        local_host = sock.getsockname()[0]
        hello = {"magic": MAGIC, "version": VERSION, "rank": rank, "world_size": world_size}
        _send(sock, {**hello, "caps": caps})
        answer = _read_line(sock, deadline, f"rank 0 at {host}:{port}")
    finally:
        sock.close()
    if "error" in answer:
        raise CommunicatorError(str(answer["error"]))
    return answer, local_host


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
    """
    if rank == 0:
        return _serve(host, port, world_size, caps, timeout_s, decide), host
    return _join(host, port, rank, world_size, caps, timeout_s)


def free_port(host: str) -> int:
    """A TCP port free right now on ``host`` (for the communicator rank 0 starts next)."""
    with socket.create_server((host, 0)) as s:
        return int(s.getsockname()[1])

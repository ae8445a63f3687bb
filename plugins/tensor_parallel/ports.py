"""Rank 0's address (``--tp-master``) and a free TCP port for a rendezvous or a communicator."""

from __future__ import annotations

import socket

from tessera.contract.comm import CommunicatorError


def free_port(host: str) -> int:
    """A TCP port free right now on ``host`` (for the communicator rank 0 starts next)."""
    with socket.create_server((host, 0)) as s:
        return int(s.getsockname()[1])


def parse_master(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a pair; a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CommunicatorError(
            f"--tp-master must be HOST:PORT with a port in 1..65535 (rank 0's address), "
            f"got '{text}'"
        )
    return host, int(port)

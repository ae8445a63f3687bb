"""Picking a free TCP port for a rendezvous or a communicator."""

from __future__ import annotations

import socket


def free_port(host: str) -> int:
    """A TCP port free right now on ``host`` (for the communicator rank 0 starts next)."""
    with socket.create_server((host, 0)) as s:
        return int(s.getsockname()[1])

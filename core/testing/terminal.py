"""A pseudo-terminal as ``sys.stderr``, for tests of output that only a terminal gets
(progress bars): ``with stderr_on_a_terminal() as term: ...`` then ``term.text``."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import struct
import sys
import termios
import threading
import time
from collections.abc import Iterator

import attrs


@attrs.define
class TerminalOutput:
    """What was written to the terminal, once the ``with`` block has ended."""

    text: str = ""


def _drain(fd: int, chunks: list[bytes]) -> None:
    # read until the writer side closes, so a long output never blocks the writer
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other end is closed
            return
        if not data:
            return
        chunks.append(data)


def _settle(chunks: list[bytes], quiet_s: float = 0.05, limit_s: float = 5.0) -> None:
    """Wait until the reader has seen nothing new for ``quiet_s``."""
    deadline = time.monotonic() + limit_s
    seen = -1
    while len(chunks) != seen and time.monotonic() < deadline:
        seen = len(chunks)
        time.sleep(quiet_s)


@contextlib.contextmanager
def stderr_on_a_terminal() -> Iterator[TerminalOutput]:
    """Replace ``sys.stderr`` with the slave end of a new pty for the block."""
    master, slave = os.openpty()
    # a new pty is 0 x 0; programs that fit their output to the width need a real size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    # write-through: a bar is written without a newline, and nothing may wait in a buffer
    stream = io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), "utf-8", write_through=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(master, chunks), daemon=True)
    reader.start()
    saved, sys.stderr = sys.stderr, stream
    out = TerminalOutput()
    try:
        yield out
    finally:
        sys.stderr = saved
        _settle(chunks)  # closing the slave end drops what the reader has not read yet
        stream.close()
        reader.join(timeout=10)
        os.close(master)
        out.text = b"".join(chunks).decode("utf-8", errors="replace")

"""A command run in a pseudo-terminal, driven as a user would (a small pexpect on ``pty``):
``send`` keystrokes, ``expect`` text in what the terminal shows, ``interrupt`` with Ctrl-C."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import time

# what terminals draw around the text (cursor moves, modes), not part of what a user reads
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")


class PtySession:
    """``argv`` running with a pty as its controlling terminal (stdin, stdout and stderr)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None = None) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: becomes the command
            if cwd:
                os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.raw = ""  # everything shown, normalized
        self.pos = 0  # where the next expect starts looking
        self.exit_code: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the command has exited and closed the terminal
            return False
        if not data:
            return False
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        self.raw += _ESCAPES.sub("", text)
        return True

    def expect(self, text: str, timeout: float = 120.0) -> str:
        """Wait until ``text`` is shown after the previous match; return what came between."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.raw.find(text, self.pos)
            if found >= 0:
                before = self.raw[self.pos : found]
                self.pos = found + len(text)
                return before
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(min(left, 0.2)):
                if self.raw.find(text, self.pos) >= 0:
                    continue
                raise AssertionError(
                    f"{text!r} was not shown; the terminal shows:\n{self.raw[self.pos :]}"
                )

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def line(self, text: str) -> None:
        """Type ``text`` and press Enter."""
        self.send(text + "\r")

    def interrupt(self) -> None:
        """Ctrl-C, as the terminal sends it: SIGINT to the foreground process."""
        self.send("\x03")

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code once the command ends (reading what it still shows)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                return self.exit_code
            self._read(0.1)
        raise AssertionError(f"the command did not exit; the terminal shows:\n{self.raw}")

    def close(self) -> None:
        if self.exit_code is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        os.close(self.fd)

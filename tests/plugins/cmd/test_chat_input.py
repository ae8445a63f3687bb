"""The chat prompt's reader on a terminal: a Ctrl-C that lands before readline starts
waiting for a key (the race a Ctrl-C typed right as the prompt appears can lose) is raised
at the prompt; plain ``input`` keeps it until the next line, which it swallows."""

from __future__ import annotations

import os
import sys

import pytest
from pty_session import PtySession

# readline's startup hook runs after the terminal is set up and before the wait for a key;
# a SIGINT sent from C there (ctypes: no Python code runs to act on it) is the lost Ctrl-C
_CHILD = """
import ctypes, functools, os, readline, signal, sys
from tessera.plugins.cmd.chat_input import interruptible_input

read = interruptible_input if sys.argv[1] == "nudged" else input
readline.set_startup_hook(functools.partial(ctypes.CDLL(None).kill, os.getpid(), signal.SIGINT))
try:
    print(f"line {read('> ')!r}", flush=True)
except KeyboardInterrupt:
    print("interrupted at the prompt", flush=True)
"""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a pty and SIGINT from C")


@pytest.fixture
def prompt(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(_CHILD, encoding="utf-8")
    sessions = []

    def start(mode: str) -> PtySession:
        env = {**os.environ, "TERM": "dumb"}
        session = PtySession([sys.executable, str(script), mode], env, cwd=str(tmp_path))
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.close()


def test_a_ctrl_c_before_the_wait_for_a_key_is_raised_at_the_prompt(prompt):
    s = prompt("nudged")
    s.expect("> ")
    s.expect("interrupted at the prompt", timeout=10)
    assert s.wait() == 0


def test_plain_input_keeps_that_ctrl_c_until_the_next_line_which_it_swallows(prompt):
    # the oracle that the race above is real: what tessera chat did before
    s = prompt("plain")
    s.expect("> ")
    with pytest.raises(AssertionError, match="was not shown"):
        s.expect("interrupted", timeout=1.5)
    s.line("a question")
    s.expect("interrupted at the prompt")
    assert "line 'a question'" not in s.raw
    assert s.wait() == 0

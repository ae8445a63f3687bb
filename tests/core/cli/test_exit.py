"""The ``tessera`` program's exit: exit handlers, buffered output and the status as a normal
exit gives them, without the interpreter's teardown unless a thread or the switch needs it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from tessera.cli.main import exit_choice
from tessera.testing import make_gguf

# A program that ends through exit_process: an exit handler, output still in stdout's buffer
# (a pipe is block-buffered), and a module global whose __del__ only a teardown runs.
_PROGRAM = """
import atexit, os, sys, threading, time
from tessera.cli.main import exit_process

class Torn:
    def __del__(self):
        os.write(2, b"teardown ran\\n")

torn = Torn()
if "close" not in sys.argv:
    atexit.register(lambda: print("exit handler ran"))
if "thread" in sys.argv:
    threading.Thread(target=lambda: (time.sleep(0.3), os.write(2, b"thread ended\\n"))).start()
if "close" in sys.argv:
    sys.stdout.write("lost")
    os.close(1)
else:
    sys.stdout.write("buffered output\\n")
exit_process(int(sys.argv[1]))
"""


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**buffered, **env},
    )


def test_the_fast_exit_keeps_handlers_output_and_status_and_skips_the_teardown():
    done = _run("3")
    assert done.returncode == 3
    assert done.stdout == "buffered output\nexit handler ran\n"
    assert "teardown ran" not in done.stderr


def test_the_switch_and_a_running_thread_take_the_normal_exit():
    for done, why in (
        (_run("0", TESSERA_FAST_EXIT_DISABLE="1"), "switch"),
        (_run("0", "thread"), "thread"),
    ):
        assert done.returncode == 0, why
        assert done.stdout == "buffered output\nexit handler ran\n", why
        assert "teardown ran" in done.stderr, why
    assert "thread ended" in _run("0", "thread").stderr  # the normal exit waited for it


def test_an_unflushable_stdout_is_status_120_as_in_a_normal_exit():
    assert _run("0", "close").returncode == 120
    assert _run("0", "close", TESSERA_FAST_EXIT_DISABLE="1").returncode == 120
    assert _run("4", "close").returncode == 4  # a failure already reported keeps its status


def test_exit_choice_names_its_reason(monkeypatch):
    monkeypatch.setenv("TESSERA_FAST_EXIT_DISABLE", "1")
    assert exit_choice() == ("teardown", "disabled by TESSERA_FAST_EXIT_DISABLE=1")
    monkeypatch.delenv("TESSERA_FAST_EXIT_DISABLE")
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="worker")
    worker.start()
    try:
        assert exit_choice() == ("teardown", "thread 'worker' still runs")
    finally:
        stop.set()
        worker.join()


def _tessera(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_a_cli_run_prints_and_exits_the_same_either_way(tmp_path):
    model = make_gguf(tmp_path / "tiny.gguf", "llama")
    argv = ["run", "-m", str(model), "-p", "hi", "-n", "6", "--temp", "0", "--backend", "numpy"]
    fast, torn = _tessera(*argv), _tessera(*argv, TESSERA_FAST_EXIT_DISABLE="1")
    assert fast.returncode == torn.returncode == 0, fast.stderr + torn.stderr
    assert fast.stdout == torn.stdout and fast.stdout.strip()
    missing = _tessera("run", "-m", str(tmp_path / "missing.gguf"))
    assert missing.returncode == 1 and missing.stderr.startswith("error:")

"""``tessera run`` reads a prompt from stdin (``-f -``, or a pipe when no -p is given) and
prints the model summary line first."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from chat_oracle import greedy_answer, user

from tessera.cli.main import main

ARGS = ["--backend", "numpy", "--temp", "0", "-n", "6", "--no-timings"]


def _run(capsys, argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_pipe_is_the_prompt_when_no_p_is_given(capsys, monkeypatch):
    code, expected, _ = _run(capsys, ["-p", "The for statement", *ARGS])
    assert code == 0
    assert _run(capsys, ARGS, "The for statement", monkeypatch)[:2] == (0, expected)
    assert _run(capsys, ["-f", "-", *ARGS], "The for statement", monkeypatch)[:2] == (0, expected)


def test_p_wins_over_a_pipe(capsys, monkeypatch):
    _, expected, _ = _run(capsys, ["-p", "Python is", *ARGS])
    assert _run(capsys, ["-p", "Python is", *ARGS], "ignored text", monkeypatch)[1] == expected


def test_empty_stdin_is_one_error_line(capsys, monkeypatch):
    code, _, err = _run(capsys, ARGS, "", monkeypatch)
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: standard input was empty")


def test_a_real_pipe_into_the_command(capsys):
    _, expected, _ = _run(capsys, ["-p", "The for statement", *ARGS])
    done = subprocess.run(
        [sys.executable, "-m", "tessera", "run", *ARGS],
        input="The for statement",
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    assert done.stderr.splitlines()[0].startswith("model: llama ")  # the summary comes first


def test_the_summary_line_is_printed_before_the_text(capsys):
    code, out, err = _run(capsys, ["-p", "Hi", *ARGS])
    first = err.splitlines()[0]
    assert code == 0 and first.startswith("model: llama 'hf' | ") and "n_ctx 512" in first
    assert "numpy/f32 on cpu" in first and first not in out


def test_chat_wraps_the_prompt_and_system_message_in_the_template(capsys):
    code, out, _ = _run(capsys, ["--chat", "-sys", "Be brief.", "-p", "What is a list?", *ARGS])
    messages = [{"role": "system", "content": "Be brief."}, user("What is a list?")]
    assert code == 0 and out == greedy_answer(messages, 6) + "\n"

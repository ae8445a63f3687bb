"""``tessera chat -f FILE`` and ``-f -``: the questions come from a file or standard input,
one per line, and each answer equals the engine's greedy generate on the conversation."""

from __future__ import annotations

import io
import sys

from chat_oracle import assistant, greedy_answer, user

from tessera.cli.main import main

Q1, Q2 = "What is a list?", "And a tuple?"


def _answers() -> str:
    a1 = greedy_answer([user(Q1)], 8)
    a2 = greedy_answer([user(Q1), assistant(a1), user(Q2)], 8)
    return a1 + "\n" + a2 + "\n\n"


def test_questions_from_a_file_are_answered_in_turn(tmp_path, monkeypatch, capsys):
    questions = tmp_path / "questions.txt"
    questions.write_text(f"{Q1}\n\n{Q2}\n", encoding="utf-8")  # a blank line is skipped
    monkeypatch.setattr(sys, "stdin", io.StringIO("not read\n"))
    code = main(["chat", "--backend", "numpy", "--temp", "0", "-n", "8", "-f", str(questions)])
    assert code == 0 and capsys.readouterr().out == _answers()


def test_dash_reads_the_questions_from_standard_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{Q1}\n{Q2}\n"))
    code = main(["chat", "--backend", "numpy", "--temp", "0", "-n", "8", "-f", "-"])
    assert code == 0 and capsys.readouterr().out == _answers()


def test_a_missing_questions_file_is_one_error_line(tmp_path, capsys):
    code = main(["chat", "--backend", "numpy", "-f", str(tmp_path / "absent.txt")])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot read questions file" in err and "absent.txt" in err

"""Progress bars: drawn on a terminal's stderr, nothing at all when stderr is not one."""

from __future__ import annotations

import io
import sys

from tessera.progress_bar import progress
from tessera.testing.terminal import stderr_on_a_terminal


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch):
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    assert list(progress(range(5), "counting", unit="step")) == [0, 1, 2, 3, 4]
    assert captured.getvalue() == ""


def test_a_bar_on_a_terminal_names_the_step_and_its_size():
    with stderr_on_a_terminal() as term:
        assert list(progress(iter(range(7)), "counting", unit="step", total=7)) == list(range(7))
    assert "counting" in term.text and "/7" in term.text and "step" in term.text


def test_the_bar_is_erased_when_the_step_ends():
    with stderr_on_a_terminal() as term:
        list(progress(range(3), "counting"))
    # leave=False: the last thing written returns to the line's start over a blank line
    assert term.text.rstrip(" ").endswith("\r")

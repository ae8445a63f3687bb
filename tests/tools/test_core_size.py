"""tools/core_size.py: its counts on a source whose lines are counted by hand, core/testing
left out, and --check failing on a file over 300 lines."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import core_size  # noqa: E402

SOURCE = '''"""Module docstring,
over two lines."""

import os  # a comment after code is code


# a comment line
class A:
    """Class docstring."""

    x = """not a docstring:
    an assignment"""

    def f(self):
        """One line."""
        return os.sep
'''


def test_code_lines_leave_out_blank_comment_and_docstring_lines():
    assert core_size.physical_lines(SOURCE) == 16
    # import, class A, x = (two lines), def f, return
    assert core_size.code_lines(SOURCE) == 6


def _tree(root: Path, n_lines: int) -> Path:
    for rel in ("core/engine/a.py", "core/testing/kit.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "core/engine/a.py").write_text("x = 1\n" * n_lines)
    (root / "core/testing/kit.py").write_text("y = 2\n" * 1000)  # not counted
    return root


def test_totals_leave_out_core_testing(tmp_path, capsys):
    assert core_size.main(["--root", str(_tree(tmp_path, 300)), "--check"]) == 0
    assert "core: 1 files, 300 lines (wc -l), 300 code lines" in capsys.readouterr().out


def test_check_fails_on_a_file_over_300_lines(tmp_path, capsys):
    assert core_size.main(["--root", str(_tree(tmp_path, 301)), "--check"]) == 1
    assert "core/engine/a.py has 301 lines" in capsys.readouterr().err

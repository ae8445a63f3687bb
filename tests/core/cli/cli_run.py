"""Running the CLI in a test: its exit code and output, and its one error line."""

from __future__ import annotations

from tessera.cli.main import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines[-1].startswith("error: ")
    return lines[-1]

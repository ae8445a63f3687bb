"""Flags out of their range are refused when the command line is parsed (before any model
loads), and a model file the process may not read is one error line."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from cli_run import error_line, run_cli

from tessera.cli.main import build_parser, main
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf", "llama")


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: a refused flag must stop the command before."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the flag was refused")

    monkeypatch.setattr("tessera.cli.args.load_model", refuse)


def parse(*argv: str):
    return build_parser(Runtime()).parse_args(list(argv))


def refused(capsys, *argv: str) -> str:
    """The argparse error line of ``tessera ARGV`` (exit code 2)."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--temp", "nan", ["--temp", "temperature must be a finite number", "got nan"]),
        ("--temp", "inf", ["temperature", "got inf"]),
        ("--top-p", "nan", ["--top-p", "top_p", "between 0 and 1"]),
        ("--top-p", "1.5", ["top_p", "between 0 and 1", "got 1.5"]),
        ("--min-p", "-inf", ["--min-p", "min_p"]),
        ("--repeat-penalty", "0", ["--repeat-penalty", "repeat_penalty", "> 0", "got 0.0"]),
        ("--repeat-penalty", "nan", ["repeat_penalty", "finite"]),
        ("--repeat-last-n", "-2", ["--repeat-last-n", ">= -1"]),
        ("-s", "-2", ["-s/--seed", "-1 for a random seed", "got -2"]),
        ("-s", str(2**64), ["-s/--seed", "2**64 - 1"]),
        ("-s", "1.5", ["-s/--seed", "expected an integer, got '1.5'"]),
        ("-c", "-3", ["-c/--ctx-size", "at least 0", "got -3"]),
        ("-n", "-3", ["-n/--n-predict", "at least -2", "got -3"]),
        ("-t", "0", ["-t/--threads", "at least 1", "got 0"]),
        ("-t", "-4", ["-t/--threads", "at least 1", "got -4"]),
        ("-b", "0", ["-b/--batch-size", "at least 1"]),
        ("-ub", "0", ["-ub/--ubatch-size", "at least 1"]),
        ("-np", "0", ["-np/--parallel", "at least 1"]),
        ("-np", "x", ["-np/--parallel", "expected an integer, got 'x'"]),
    ],
)
def test_run_refuses_a_flag_out_of_range_before_loading(
    capsys, no_model_load, tiny_gguf, flag, value, words
):
    line = refused(capsys, "run", "-m", str(tiny_gguf), "-p", "hi", f"{flag}={value}")
    assert "tessera run: error: argument" in line
    for w in words:
        assert w in line, line


@pytest.mark.parametrize("command", ["serve", "embed", "batched-bench"])
@pytest.mark.parametrize(("flag", "value"), [("-np", "0"), ("-c", "-3"), ("-t", "0"), ("-b", "0")])
def test_other_commands_refuse_the_model_flags_too(capsys, no_model_load, command, flag, value):
    line = refused(capsys, command, f"{flag}={value}")
    assert f"tessera {command}: error: argument {flag}" in line


def test_seed_minus_one_is_random_and_the_defaults_stay():
    assert parse("run", "-s", "-1").seed is None
    assert parse("run", "-s", "0").seed == 0
    assert parse("run", "-s", str(2**64 - 1)).seed == 2**64 - 1
    args = parse("run")
    assert (args.threads, args.ctx_size, args.seed, args.n_predict) == (0, 0, None, 128)
    assert parse("run", "--temp", "-1").temp == -1.0  # greedy, as llama.cpp
    assert parse("run", "-n", "-1").n_predict == -1
    assert parse("run", "-n", "-2").n_predict == -2  # llama.cpp: until the context is full


def test_run_with_seed_minus_one_generates(capsys, tiny_gguf):
    argv = ["run", "-m", str(tiny_gguf), "-p", "hi", "-n", "3", "-s", "-1", "--backend", "numpy"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert "generation: 3 tokens" in err


@pytest.fixture
def unreadable(monkeypatch, tiny_gguf, tmp_path):
    """A copy of a small model whose opening raises PermissionError (chmod 000 does not
    stop root, so the open is patched; the real chmod case is tested below for non-root)."""
    path = tmp_path / "locked.gguf"
    shutil.copy(tiny_gguf, path)
    real_open = pathlib.Path.open

    def guarded(self, *args, **kwargs):
        if self.name == path.name:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", guarded)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "-p", "hi", "--backend", "numpy", "-m"],
        ["serve", "--backend", "numpy", "--port", "0", "-m"],
        ["quantize"],
    ],
)
def test_an_unreadable_model_is_one_error_line(capsys, unreadable, tmp_path, argv):
    tail = [str(tmp_path / "out.gguf"), "q8_0"] if argv == ["quantize"] else []
    code, _, err = run_cli(capsys, *argv, str(unreadable), *tail)
    line = error_line(err)
    assert code == 1
    assert f"cannot read model file '{unreadable}' (Permission denied)" in line
    assert "chmod a+r" in line
    assert not (tmp_path / "out.gguf").exists()


def _run_unprivileged(argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of ``tessera ARGV`` in a process that file modes bind: as root,
    one that lost the capabilities which let root read any file (util-linux's setpriv)."""
    command = [sys.executable, "-m", "tessera", *argv]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: chmod 000 cannot bind this process")
        drop = "-dac_override,-dac_read_search"
        command = [setpriv, f"--bounding-set={drop}", f"--inh-caps={drop}", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    return result.returncode, result.stderr


def test_a_chmod_000_model_is_one_error_line(tiny_gguf, tmp_path):
    path = tmp_path / "locked.gguf"
    shutil.copy(tiny_gguf, path)
    path.chmod(0)
    try:
        code, err = _run_unprivileged(["run", "-m", str(path), "-p", "hi", "--backend", "numpy"])
    finally:
        path.chmod(0o644)
    assert code == 1
    assert "Permission denied" in error_line(err)

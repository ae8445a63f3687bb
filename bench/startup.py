"""Start-up to first token, tessera vs llama.cpp's llama-cli, llama-completion and
llama-simple, side by side.

    nice -n 19 python bench/startup.py --model F16=/tmp/m-f16.gguf --model Q8_0=/tmp/m-q8_0.gguf \\
        --llama-bin /tmp/llama-build/bin -r 5 --variant "numpy F16=TESSERA_DISABLE_KERNELS=F16"

Each process is timed from its start to its exit: ``tessera run -m FILE -p Hello -n 1``
(load, tokenize, prefill, one token) and llama.cpp's three programs that do that work:
``llama-cli -m FILE -p Hello -n 1 -st`` (one chat turn: the prompt goes through the chat
template, after a warm-up decode), ``llama-completion -m FILE -p Hello -n 1 -no-cnv`` (the
plain completion, after a warm-up decode) and ``llama-simple -m FILE -n 1 Hello`` (no
warm-up), each with standard input closed. ``--llama-bin`` names the folder holding them
(those missing there are left out); ``--llama-simple`` and the like name one program.
Every round runs each engine (and each ``--variant``, tessera with extra
environment variables) once per model, in a rotated order so a drift in machine load
hits all alike. The table gives the median and the best wall time over the rounds, the
median CPU time (user + system) and the median ratio of each engine to each llama.cpp
program. The model files'
pages are read once first, so every run finds them in the page cache, and each engine runs
once untimed per model first. tessera runs as an installed package does, with its modules'
bytecode cached (under a temporary ``PYTHONPYCACHEPREFIX``; a ``PYTHONDONTWRITEBYTECODE``
in the environment would make every run compile ~300 modules from source again).
Only the standard library is used.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: One run: (wall seconds, CPU seconds).
Sample = tuple[float, float]


def timed(cmd: list[str], env: dict[str, str]) -> Sample:
    """Wall and CPU time (user + system) of ``cmd`` run to its end; a failure stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {' | '.join(tail)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def warm_page_cache(path: str) -> None:
    """Read the file once so that no engine pays for the disk."""
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def parse_pairs(values: list[str], what: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` arguments as pairs; a missing ``=`` is an error naming the argument."""
    pairs = []
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{what} '{v}' is not NAME=VALUE; e.g. {what} F16=/tmp/m.gguf")
        pairs.append((name, rest))
    return pairs


#: Each llama.cpp program's arguments after its path, MODEL and PROMPT filled in per run.
LLAMA_PROGRAMS = {
    "llama-cli": ["-m", "MODEL", "-p", "PROMPT", "-n", "1", "-st"],
    "llama-completion": ["-m", "MODEL", "-p", "PROMPT", "-n", "1", "-no-cnv"],
    "llama-simple": ["-n", "1", "-m", "MODEL", "PROMPT"],
}


def llama_programs(args: argparse.Namespace) -> dict[str, str]:
    """The llama.cpp programs to run, by name: those given one by one, and those found in
    ``--llama-bin``."""
    found = {}
    for name in LLAMA_PROGRAMS:
        given = getattr(args, name.replace("-", "_"))
        in_bin = Path(args.llama_bin, name) if args.llama_bin else None
        if given:
            found[name] = given
        elif in_bin is not None and in_bin.exists():
            found[name] = str(in_bin)
    return found


def engines(args: argparse.Namespace, pycache: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """``(label, command, environment)`` of every engine and variant measured (MODEL and
    PROMPT stand for the model's path and the prompt); tessera's Python caches its bytecode
    under ``pycache``."""
    base = dict(os.environ, PYTHONPYCACHEPREFIX=pycache)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    tessera = [args.tessera, "run", "-p", "PROMPT", "-n", "1", "-m", "MODEL"]
    out = [("tessera", tessera, base)]
    for label, assignment in parse_pairs(args.variant, "--variant"):
        env = dict(base)
        for item in assignment.split(","):
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--variant '{label}={assignment}': '{item}' is not VAR=VALUE")
            env[key] = value
        out.append((f"tessera {label}", out[0][1], env))
    for name, path in llama_programs(args).items():
        lib = str(Path(path).resolve().parent)
        env = dict(base, LD_LIBRARY_PATH=lib + os.pathsep + base.get("LD_LIBRARY_PATH", ""))
        out.append((name, [path, *LLAMA_PROGRAMS[name]], env))
    return out


def command(template: list[str], model: str, prompt: str) -> list[str]:
    """``template`` with MODEL and PROMPT filled in."""
    return [{"MODEL": model, "PROMPT": prompt}.get(part, part) for part in template]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH of a GGUF")
    ap.add_argument("--tessera", default=str(Path(sys.executable).parent / "tessera"))
    ap.add_argument("--llama-bin", default=None, help="folder of llama.cpp's programs")
    for name in LLAMA_PROGRAMS:
        ap.add_argument(f"--{name}", default=None, help=f"path of a {name} binary")
    ap.add_argument(
        "--variant", action="append", default=[], help="LABEL=VAR=VALUE[,VAR=VALUE]: tessera so"
    )
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--prompt", default="Hello")
    args = ap.parse_args()
    models = parse_pairs(args.model, "--model")
    runs = engines(args, tempfile.mkdtemp(prefix="tessera-pycache-"))
    for _, path in models:
        warm_page_cache(path)
        for _, prefix, env in runs:  # bytecode, compiled kernels: what an install has
            timed(command(prefix, path, args.prompt), env)
    samples: dict[tuple[str, str], list[Sample]] = {}
    for r in range(args.rounds):
        for name, path in models:
            k = r % len(runs)
            for label, prefix, env in runs[k:] + runs[:k]:
                sample = timed(command(prefix, path, args.prompt), env)
                samples.setdefault((name, label), []).append(sample)
                print(f"round {r + 1} {name} {label}: {sample[0]:.2f} s", file=sys.stderr)
    refs = [label for label, _, _ in runs if label in LLAMA_PROGRAMS]
    print("| model | engine | wall median (s) | wall best (s) | CPU median (s) | "
          + "".join(f"x {ref} | " for ref in refs).rstrip())  # fmt: skip
    print("|---|---|---:|---:|---:|" + "---:|" * len(refs))
    for name, _ in models:
        for label, _, _ in runs:
            got = samples[(name, label)]
            walls = [w for w, _ in got]
            ratios = []
            for ref in refs:
                per_round = zip(walls, samples[(name, ref)], strict=True)
                ratios.append(f" {statistics.median(w / rw for w, (rw, _) in per_round):.1f}x |")
            print(f"| {name} | {label} | {statistics.median(walls):.2f} | {min(walls):.2f} | "
                  f"{statistics.median(c for _, c in got):.2f} |" + "".join(ratios))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

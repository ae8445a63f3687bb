"""Speed of two tessera installs side by side: `tessera bench` run interleaved, one process a turn.

    python bench/before_after.py --before /tmp/before-venv/bin/tessera \\
        --after .venv/bin/tessera --model F16=/tmp/m-f16.gguf --model Q4_0=/tmp/m-q4_0.gguf \\
        --rounds 3 -t 2 -p 512 -n 128 -r 2 --out /tmp/before_after.md

Each round runs, for every model, one `tessera bench -m FILE -p P -n N -r R -t T -o jsonl`
per install; which install goes first alternates from round to round (before, after, after,
before, ...), so a drift in machine load hits both alike. Every sample (`samples_ts` of each
row) is kept; the table gives the medians per install and their ratio after/before. The
markdown table and the raw samples go to --out (and the raw records, as JSON, next to it).
Only the standard library is used, so any Python runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def bench_once(
    exe: str, model: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], str]:
    """``{test: [t/s samples]}`` of one `tessera bench` process, and its command line."""
    cmd = [exe, "bench", "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "-o", "jsonl"]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    return {row["test"]: [float(x) for x in row["samples_ts"]] for row in rows}, " ".join(cmd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="tessera executable of the old tree")
    ap.add_argument("--after", required=True, help="tessera executable of the new tree")
    ap.add_argument("--model", action="append", required=True, metavar="TYPE=FILE")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=1)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("before_after.md"))
    args = ap.parse_args()
    models = [m.split("=", 1) for m in args.model]
    trees = {"before": args.before, "after": args.after}
    samples: dict[tuple[str, str, str], list[float]] = {}
    commands: list[str] = []
    log: list[dict] = []
    start = time.time()
    for rnd in range(args.rounds):
        order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
        for qtype, path in models:
            for tree in order:
                got, cmd = bench_once(trees[tree], path, args)
                commands.append(cmd)
                for test, values in got.items():
                    samples.setdefault((qtype, test, tree), []).extend(values)
                    log.append({"round": rnd, "type": qtype, "test": test, "tree": tree,
                                "samples_ts": values, "loadavg": os.getloadavg()})  # fmt: skip
                print(f"[{time.time() - start:6.0f}s] load {os.getloadavg()[0]:.2f} round {rnd} "
                      f"{qtype} {tree}: "
                      + ", ".join(f"{t} {' '.join(f'{v:.2f}' for v in vs)}"
                                  for t, vs in got.items()), flush=True)  # fmt: skip
    lines = ["| type | test | before t/s (median) | after t/s (median) | after/before "
             "| before samples | after samples |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for qtype, _ in models:
        for test in sorted({k[1] for k in samples if k[0] == qtype}, key=lambda t: t[:2] != "pp"):
            b, a = samples.get((qtype, test, "before"), []), samples.get((qtype, test, "after"), [])
            mb, ma = statistics.median(b), statistics.median(a)
            lines.append(f"| {qtype} | {test} | {mb:.2f} | {ma:.2f} | {ma / mb:.3f} | "
                         f"{', '.join(f'{v:.2f}' for v in b)} | "
                         f"{', '.join(f'{v:.2f}' for v in a)} |")  # fmt: skip
    table = "\n".join(lines)
    print(table)
    args.out.write_text(table + "\n\nCommands, in run order:\n\n"
                        + "\n".join(f"    {c}" for c in commands) + "\n")  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

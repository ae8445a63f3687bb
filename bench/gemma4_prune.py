"""Prefill pruning on vs off on Gemma-4-E2B/E4B-shaped models, side by side (docs/gemma4.md).

Runs ``tessera bench --shape NAME -p 512 -n 128 --prune on,off -o json`` once per shape
(a fresh process each, so one model's memory is freed before the next is built), then
prints the pp and tg speeds with pruning on and off, their ratios and the targets
(pp512 ratio >= 2.0 on E2B, >= 1.4 on E4B; tg128 within 3%).

    .venv/bin/python bench/gemma4_prune.py -r 2 -t 1 --json /tmp/gemma4-prune.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from tessera.testing.shapes import DEFAULT_SHAPE_VOCAB

TARGETS = {"gemma4-e2b": 2.0, "gemma4-e4b": 1.4}
TG_TOLERANCE = 0.03


def bench_shape(shape: str, args: argparse.Namespace) -> list[dict]:
    tessera = Path(sys.executable).with_name("tessera")
    cmd = [str(tessera), "bench", "--shape", shape, "-p", str(args.p), "-n", str(args.n),
           "-r", str(args.r), "-t", str(args.t), "--prune", "on,off", "-o", "json"]  # fmt: skip
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def summary_rows(records: list[dict]) -> list[str]:
    by = {(r["test"], r["prune"]): r for r in records}
    shape = records[0]["model_type"].split()[-1]
    pp = [t for t, p in by if t.startswith("pp") and p == "on"]
    tg = [t for t, p in by if t.startswith("tg") and p == "on"]
    rows = []
    for test in pp + tg:
        on, off = by[(test, "on")], by[(test, "off")]
        ratio = on["avg_ts"] / off["avg_ts"]
        if test.startswith("pp"):
            target = TARGETS.get(shape)
            verdict = "" if target is None else ("met" if ratio >= target else "NOT met")
            goal = f">= {target}" if target else "-"
        else:
            verdict = "met" if abs(ratio - 1) <= TG_TOLERANCE else "NOT met"
            goal = f"1 ± {TG_TOLERANCE}"
        rows.append(
            f"| {shape} | {test} | {on['avg_ts']:.2f} ± {on['stddev_ts']:.2f} | "
            f"{off['avg_ts']:.2f} ± {off['stddev_ts']:.2f} | {ratio:.2f} | {goal} | {verdict} |"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="gemma4-e2b,gemma4-e4b")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write every record here")
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    records = {shape: bench_shape(shape, args) for shape in args.shapes.split(",")}
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
    first = next(iter(records.values()))[0]
    print(f"started {started}; backend {first['backends']}/{first['dtype']}, threads {args.t}, "
          f"{args.r} runs per test, vocabulary shrunk to {DEFAULT_SHAPE_VOCAB}\n")  # fmt: skip
    print("| shape | test | prune on t/s | prune off t/s | on/off | target | |")
    print("|---|---|---|---|---|---|---|")
    for shape_records in records.values():
        for row in summary_rows(shape_records):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())

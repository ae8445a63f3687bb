"""Soak test of ``tessera serve``: many concurrent streaming clients, some of which hang up
mid-stream, for minutes (docs/server.md, "Soak").

Starts the server as a subprocess on a free loopback port. Each client loops: a streamed
completion of a random length; with probability ``--cancel`` it closes the connection
after a random number of chunks instead of reading to the end. A request that was not
cancelled must end with ``finish_reason`` and ``[DONE]``; anything else (an HTTP error, a
cut stream, a timeout) counts as failed. Every batch size from 1 to ``-np`` runs once
first (the end of a load decodes smaller batches than its middle). The server's RSS is
sampled every few seconds; growth is measured from the end of the warm-up to the end. At the end the
clients stop, the slots must all be idle (``/slots``) within ten seconds, and ``/health``
must answer ok.

    .venv/bin/python bench/server_soak.py --clients 64 --minutes 10
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path

from batched_bench_rows import model_path  # noqa: E402 (bench/ is the script's directory)
from server_load import PROMPTS, start_server  # noqa: E402

from tessera.plugin_manager import Runtime


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0, "tokens": 0}
        self.failures: list[str] = []

    def add(self, key: str, tokens: int = 0, why: str = "") -> None:
        with self.lock:
            self.counts[key] += 1
            self.counts["tokens"] += tokens
            if why and len(self.failures) < 20:
                self.failures.append(why)


def one_stream(url: str, rng: random.Random, cancel_p: float, max_tokens: int, tally: Tally):
    host, port = url.removeprefix("http://").split(":")
    n = rng.randint(max(1, max_tokens // 4), max_tokens)
    cancel_after = rng.randint(1, n) if rng.random() < cancel_p else None
    body = {"prompt": rng.choice(PROMPTS), "max_tokens": n, "stream": True, "ignore_eos": True}
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        if resp.status != 200:
            tally.add("failed", why=f"HTTP {resp.status}: {resp.read()[:200]!r}")
            return
        chunks, finish, done = 0, None, False
        for line in resp:
            if line.startswith(b"data: [DONE]"):
                done = True
                break
            if not line.startswith(b"data: "):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                tally.add("failed", why=f"error event: {event['error']}")
                return
            if event["choices"]:
                chunks += 1
                finish = event["choices"][0]["finish_reason"] or finish
            if cancel_after is not None and chunks >= cancel_after:
                tally.add("cancelled", tokens=chunks)
                return  # closing the connection is the cancel
        if done and finish is not None:
            tally.add("completed", tokens=chunks)
        else:
            tally.add("failed", why=f"stream ended without finish/[DONE] after {chunks} chunks")
    except (OSError, http.client.HTTPException) as exc:
        tally.add("failed", why=f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="default, qwen2.5-0.5b-shape or a path")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=60.0, help="RSS baseline after this")
    ap.add_argument("--cancel", type=float, default=0.3, help="share of streams cut short")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("-np", "--parallel", type=int, default=8)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/tessera-bench"))
    args = ap.parse_args()

    path = model_path(args.model, args.cache_dir, Runtime())
    extra = ["--max-queue", str(args.clients)]
    proc, url = start_server(path, args.parallel, args.ctx_size, extra)
    tally = Tally()
    stop = threading.Event()
    t_start = time.monotonic()
    t_end = t_start + args.minutes * 60

    def client(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        while not stop.is_set() and time.monotonic() < t_end:
            one_stream(url, rng, args.cancel, args.max_tokens, tally)

    # Every batch size once first: a full load only ever decodes -np rows at a time, and
    # smaller batches (the load's end) take paths and buffer sizes of their own.
    for n in range(1, args.parallel + 1):
        warm = [
            threading.Thread(target=one_stream, args=(url, random.Random(-i), 0.0, 16, Tally()))
            for i in range(n)
        ]
        for t in warm:
            t.start()
        for t in warm:
            t.join()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    try:
        for t in threads:
            t.start()
        samples: list[tuple[float, int]] = []
        while time.monotonic() < t_end:
            samples.append((time.monotonic() - t_start, rss_bytes(proc.pid)))
            time.sleep(5)
        stop.set()
        for t in threads:
            t.join(300)
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(url + "/slots", timeout=10) as r:
                busy = [s["id"] for s in json.loads(r.read()) if s["is_processing"]]
            if not busy or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            health = json.loads(r.read())["status"]
        samples.append((time.monotonic() - t_start, rss_bytes(proc.pid)))
    finally:
        proc.terminate()
        proc.wait(60)

    base = next((rss for t, rss in samples if t >= args.warmup_s), samples[0][1])
    peak, last = max(rss for _, rss in samples), samples[-1][1]
    c = tally.counts
    elapsed = samples[-1][0]
    print(f"model {path.name}, {args.clients} clients, -np {args.parallel}, {elapsed / 60:.1f} min")
    print("| clients | minutes | completed | cancelled | failed | out tok/s | leaked slots "
          "| RSS after warm-up MiB | RSS end MiB | growth | health |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print(
        f"| {args.clients} | {elapsed / 60:.1f} | {c['completed']} | {c['cancelled']} | "
        f"{c['failed']} | {c['tokens'] / elapsed:.1f} | {len(busy)} | {base / 2**20:.0f} | "
        f"{last / 2**20:.0f} | {100 * (last - base) / base:+.1f}% | {health} |"
    )
    print(f"peak RSS {peak / 2**20:.0f} MiB")
    by_minute = {int(t // 60): rss for t, rss in samples}  # the last sample of each minute
    print("RSS by minute (MiB):", " ".join(f"{m}:{r / 2**20:.0f}" for m, r in by_minute.items()))
    for why in tally.failures:
        print("failure:", why)
    ok = c["failed"] == 0 and not busy and health == "ok" and last <= base * 1.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load test of ``tessera serve`` with 1, 4 and 8 concurrent streaming clients (docs/server.md).

Starts the server as a subprocess on a free loopback port, then for each client count
runs a bounded number of streamed completions (the official ``openai`` client, one thread
per client) and reports requests/s, output tokens/s, time to first token and
inter-token latency (p50/p95), and failed requests. Every request asks for exactly
``--max-tokens`` tokens (``ignore_eos``) so that runs compare like with like.

    .venv/bin/python bench/server_load.py --model default --clients 1,4,8 --requests 24
    .venv/bin/python bench/server_load.py --model qwen2.5-0.5b-shape --max-tokens 32

``--model``: ``default`` (the bundled model), ``qwen2.5-0.5b-shape`` (random weights,
Qwen2.5-0.5B's sizes) or a GGUF path.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from batched_bench_rows import model_path  # noqa: E402 (bench/ is the script's directory)

from tessera.plugin_manager import Runtime

PROMPTS = [
    "Once upon a time there was a little dog who",
    "The sun came up over the hills and the children",
    "In the morning the old man walked to the",
    "She opened the box and found a",
    "The function returns a list of the",
    "After the rain stopped, the birds",
    "He wrote a letter to his friend about the",
    "The little cat was afraid of the",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def start_server(path: Path, n_slots: int, n_ctx: int, extra: list[str]) -> tuple[Any, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "tessera", "serve", "-m", str(path), "--port", str(port)]
    cmd += ["-np", str(n_slots), "-c", str(n_ctx), *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5):
                return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start: " + proc.stderr.read()) from None
            time.sleep(0.2)


def one_request_raw(url: str, prompt: str, max_tokens: int) -> dict:
    """The same request over http.client, reading SSE lines by hand: a light client, so
    the client process takes less of the cores the server needs."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    )
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    times: list[float] = []
    n_tokens = 0
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["text"]:
            times.append(time.perf_counter())
        if chunk.get("usage"):
            n_tokens = chunk["usage"]["completion_tokens"]
    conn.close()
    return {
        "ttft": times[0] - t0 if times else float("nan"),
        "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
        "n_tokens": n_tokens,
        "t": time.perf_counter() - t0,
    }


def one_request(client, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    times: list[float] = []
    stream = client.completions.create(
        model="bench",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    n_tokens = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage is not None:
            n_tokens = chunk.usage.completion_tokens
    return {
        "ttft": times[0] - t0 if times else float("nan"),
        "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
        "n_tokens": n_tokens,
        "t": time.perf_counter() - t0,
    }


def run_level(
    url: str, n_clients: int, n_requests: int, max_tokens: int, duration: float, kind: str
):
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=600)
    lock = threading.Lock()
    counter = iter(range(n_requests))
    results: list[dict] = []
    failures: list[str] = []
    t_end = time.monotonic() + duration

    def worker() -> None:
        while time.monotonic() < t_end:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                prompt = PROMPTS[i % len(PROMPTS)]
                if kind == "openai":
                    r = one_request(client, prompt, max_tokens)
                else:
                    r = one_request_raw(url, prompt, max_tokens)
            except Exception as exc:  # counted, not raised: the report says how many
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    n_out = sum(r["n_tokens"] for r in results)
    return {
        "clients": n_clients,
        "requests": len(results),
        "failed": len(failures),
        "failures": failures[:3],
        "wall_s": wall,
        "req_per_s": len(results) / wall,
        "out_tok_per_s": n_out / wall,
        "ttft_p50_ms": _percentile(ttft, 0.5) * 1e3,
        "ttft_p95_ms": _percentile(ttft, 0.95) * 1e3,
        "itl_p50_ms": _percentile(itl, 0.5) * 1e3,
        "itl_p95_ms": _percentile(itl, 0.95) * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/tessera-bench"))
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--requests", type=int, default=24, help="requests per client count")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--duration", type=float, default=300, help="seconds per client count")
    ap.add_argument("--server-args", default="", help="extra flags for tessera serve")
    ap.add_argument(
        "--client",
        choices=["raw", "openai"],
        default="raw",
        help="raw: http.client and hand-read SSE (light); openai: the official client",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    path = model_path(args.model, args.cache_dir, Runtime())
    n_ctx = max(levels) * (args.max_tokens + 64)
    proc, url = start_server(path, max(levels), n_ctx, args.server_args.split())
    rows = []
    try:
        # warm-up: first-call costs stay out of the numbers
        run_level(url, 1, 2, 4, 60, args.client)
        for n in levels:
            n_requests = max(args.requests, n)
            rows.append(run_level(url, n, n_requests, args.max_tokens, args.duration, args.client))
    finally:
        proc.terminate()
        proc.wait(60)
    print(
        f"model: {args.model}; {args.max_tokens} tokens per request; client {args.client}; "
        f"cpu count {os.cpu_count()}"
    )
    print(
        "| clients | requests | failed | req/s | out tok/s | TTFT p50 ms | TTFT p95 ms "
        "| ITL p50 ms | ITL p95 ms |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['clients']} | {r['requests']} | {r['failed']} | {r['req_per_s']:.2f} "
            f"| {r['out_tok_per_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} "
            f"| {r['itl_p50_ms']:.1f} | {r['itl_p95_ms']:.1f} |"
        )
    base = rows[0]["out_tok_per_s"]
    for r in rows[1:]:
        print(
            f"aggregate tok/s, {r['clients']} clients vs {rows[0]['clients']}: "
            f"{r['out_tok_per_s'] / base:.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The clients of bench/server_load.py: streamed ``/v1/completions`` requests, greedy and
``ignore_eos`` so that every request generates exactly ``max_tokens`` tokens, and
``cache_prompt: false`` so that no prompt is shortened by a slot's cache; sent by
``n_clients`` threads at once.

A request's tokens are the server's own count (``usage.completion_tokens`` of the last
chunk); one that reports no usage or another count than ``max_tokens`` is a failure, so
that neither server can look faster by producing less. TTFT and inter-token latency are
taken at the streamed chunks that carry text.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlparse

from server_load_stats import summarize

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


def prompt_text(i: int, n_words: int = 0) -> str:
    """Request ``i``'s prompt: one of :data:`PROMPTS`, followed by the next ones up to
    ``n_words`` words when that is more than one sentence."""
    base = PROMPTS[i % len(PROMPTS)].split()
    words, j = list(base), i + 1
    while len(words) < n_words:
        words += PROMPTS[j % len(PROMPTS)].split()
        j += 1
    return " ".join(words[: max(n_words, len(base))])


def _body(prompt: str, max_tokens: int) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "cache_prompt": False,  # both servers read every prompt in full
    }


def _result(t0: float, times: list[float], usage: dict | None, max_tokens: int) -> dict:
    n_tokens = usage["completion_tokens"] if usage else None
    if n_tokens != max_tokens:
        raise RuntimeError(
            f"the server reported {n_tokens} completion tokens, not the {max_tokens} asked "
            "for with ignore_eos; its numbers would not compare"
        )
    return {
        "ttft": times[0] - t0 if times else float("nan"),
        "itl": [b - a for a, b in zip(times, times[1:], strict=False)],
        "n_tokens": n_tokens,
        "n_prompt": usage.get("prompt_tokens", 0),
        "t": time.perf_counter() - t0,
    }


def one_request_raw(url: str, prompt: str, max_tokens: int) -> dict:
    """The request over http.client, reading SSE lines by hand: a light client, so the
    client process takes less of the cores the server needs."""
    u = urlparse(url)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps(_body(prompt, max_tokens))
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    times: list[float] = []
    usage = None
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        if chunk["choices"] and chunk["choices"][0]["text"]:
            times.append(time.perf_counter())
        usage = chunk.get("usage") or usage
    conn.close()
    return _result(t0, times, usage, max_tokens)


def one_request_openai(client, prompt: str, max_tokens: int) -> dict:
    """The request with the official ``openai`` client."""
    body = _body(prompt, max_tokens)
    t0 = time.perf_counter()
    stream = client.completions.create(
        model="bench",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options=body["stream_options"],
        extra_body={"ignore_eos": True, "cache_prompt": False},
    )
    times: list[float] = []
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            times.append(time.perf_counter())
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    return _result(t0, times, usage, max_tokens)


def run_level(
    engine: str,
    url: str,
    n_clients: int,
    n_requests: int,
    max_tokens: int,
    *,
    duration: float = 300,
    kind: str = "raw",
    prompt_words: int = 0,
    first: int = 0,
) -> dict:
    """``n_requests`` requests (prompts ``first``, ``first + 1`` ...) from ``n_clients``
    threads, none started after ``duration`` s; the row of
    :func:`server_load_stats.summarize`. Failed requests are counted, not raised."""
    client = None
    if kind == "openai":
        from openai import OpenAI

        client = OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=600)
    lock = threading.Lock()
    counter = iter(range(first, first + n_requests))
    results: list[dict] = []
    failures: list[str] = []
    t_end = time.monotonic() + duration

    def worker() -> None:
        while time.monotonic() < t_end:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            prompt = prompt_text(i, prompt_words)
            try:
                if client is not None:
                    r = one_request_openai(client, prompt, max_tokens)
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
    return summarize(engine, n_clients, results, failures, time.perf_counter() - t0)

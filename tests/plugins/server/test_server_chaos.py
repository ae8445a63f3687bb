"""Chaos: clients that vanish at random points of a request (before the body is complete,
while queued, mid-stream) beside clients that behave. Afterwards no slot is still busy, no
request is still queued, the KV cache holds exactly what the slots say they cache, and the
server answers normally; every well-behaved client got its full answer."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
import urllib.request

import pytest

from tessera.plugins.server.testing import live_server

N_CLIENTS = 40


@pytest.fixture(scope="module")
def server():
    argv = ["--backend", "numpy", "-np", "3", "-c", "1024", "-b", "64", "--max-queue", "64"]
    with live_server(argv) as srv:
        yield srv


def _request_bytes(body: dict, path: str = "/v1/completions") -> tuple[bytes, bytes]:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    return head, data


def _vanish(url: str, rng: random.Random) -> None:
    """One misbehaving client: it leaves at a random point of a (streamed or not) request."""
    host, port = url.removeprefix("http://").split(":")
    stream = rng.random() < 0.6
    body = {"prompt": "Once upon a time", "max_tokens": rng.randint(8, 64), "stream": stream}
    body["ignore_eos"] = True
    head, data = _request_bytes(body)
    how = rng.choice(["headers only", "half body", "after send", "mid answer"])
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        if how == "headers only":
            return
        if how == "half body":
            sock.sendall(data[: len(data) // 2])
            return
        sock.sendall(data)
        if how == "after send":
            time.sleep(rng.random() * 0.2)
            return
        want = rng.randint(1, 600)  # bytes of the answer read before leaving
        got = 0
        while got < want:
            chunk = sock.recv(want - got)
            if not chunk:
                return
            got += len(chunk)


def _complete(url: str, results: list, stream: bool) -> None:
    body = {"prompt": "The for statement", "max_tokens": 12, "ignore_eos": True}
    req = urllib.request.Request(
        url + "/v1/completions",
        json.dumps({**body, "stream": stream}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if stream:
        events = [ln[6:] for ln in raw.splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]", raw[-300:]
        chunks = [json.loads(e) for e in events[:-1]]
        results.append(chunks[-1]["choices"][0]["finish_reason"])
    else:
        results.append(json.loads(raw)["choices"][0]["finish_reason"])


def _settled(server, deadline_s: float = 30.0) -> list[dict]:
    """The slots once none is processing and the queue is empty (or fail at the deadline)."""
    engine = server.model.engine
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        info = engine.slots_info()
        if not any(s["is_processing"] for s in info) and not engine._queue:
            return info
        time.sleep(0.05)
    raise AssertionError(f"slots still busy after {deadline_s} s: {engine.slots_info()}")


def test_vanishing_clients_leak_no_slot_and_spoil_no_other_answer(server, caplog):
    caplog.set_level(logging.INFO)
    rng = random.Random(1234)
    results: list = []
    errors: list = []

    def guard(fn, *args):
        try:
            fn(*args)
        except Exception as exc:  # a well-behaved client's failure is the test failing
            errors.append(exc)

    threads = []
    for i in range(N_CLIENTS):
        if i % 4 == 0:
            t = threading.Thread(target=guard, args=(_complete, server.url, results, i % 8 == 0))
        else:
            seed = rng.random()
            t = threading.Thread(target=_vanish, args=(server.url, random.Random(seed)))
        threads.append(t)
        t.start()
        time.sleep(rng.random() * 0.05)
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, errors
    assert results == ["length"] * (N_CLIENTS // 4)

    info = _settled(server)
    kv = server.model.engine.ctx.kv
    assert kv.n_used == sum(s["n_cached_tokens"] for s in info)
    # and the server still serves
    after: list = []
    _complete(server.url, after, stream=True)
    assert after == ["length"]
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    # a vanished client is not an error of the server: nothing logged as one
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text[-2000:]

"""Prompt cache, slots and their files, the small endpoints, disconnects and shutdown."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def _get(url: str):
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
        return json.loads(body) if r.headers.get_content_type() == "application/json" else body


def _post(url: str, payload: dict):
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _metric(server, name: str) -> float:
    text = _get(server.url + "/metrics").decode()
    for line in text.splitlines():
        if line.startswith(f"tessera:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _wait_idle(server, timeout=30.0):
    deadline = time.monotonic() + timeout
    while any(s["is_processing"] for s in _get(server.url + "/slots")):
        assert time.monotonic() < deadline, "a slot stayed busy"
        time.sleep(0.05)


def test_a_second_request_with_the_same_prefix_evaluates_only_new_tokens(client, server):
    _wait_idle(server)
    prefix = "The little dog ran to the park and played with a ball all day long"
    first = client.completions.create(model="m", prompt=prefix, max_tokens=2, temperature=0)
    before = _metric(server, "prompt_tokens_total")
    second = client.completions.create(
        model="m", prompt=prefix + " until the sun went down", max_tokens=2, temperature=0
    )
    evaluated = _metric(server, "prompt_tokens_total") - before
    n_new = second.usage.prompt_tokens - first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    assert second.timings["prompt_n"] == n_new and second.timings["cache_n"] == (
        first.usage.prompt_tokens
    )
    assert evaluated == n_new


def test_slot_save_erase_restore_then_continue_gives_identical_tokens(client, server):
    _wait_idle(server)
    kw = dict(model="m", prompt="Once upon a time there was", max_tokens=12, temperature=0)
    first = client.completions.create(**kw, extra_body={"id_slot": 2})
    saved = _post(server.url + "/slots/2?action=save", {"filename": "story.bin"})
    assert saved["n_saved"] == first.usage.prompt_tokens + 11 and saved["n_written"] > 0
    assert (server.state.settings.slot_save_path / "story.bin").is_file()
    assert _post(server.url + "/slots/2?action=erase", {})["n_erased"] == saved["n_saved"]
    assert _get(server.url + "/slots")[2]["n_cached_tokens"] == 0
    restored = _post(server.url + "/slots/2?action=restore", {"filename": "story.bin"})
    assert restored["n_restored"] == saved["n_saved"]
    again = client.completions.create(**kw, extra_body={"id_slot": 2})
    assert again.choices[0].text == first.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1


def test_embedding_requests_leave_the_prompt_cache_untouched(client, server):
    _wait_idle(server)
    before = [s["n_cached_tokens"] for s in _get(server.url + "/slots")]
    cached = _metric(server, "prompt_tokens_cached_total")
    r = client.embeddings.create(model="m", input=["a dog", "the sun rose"])
    assert len(r.data) == 2 and len(r.data[0].embedding) > 0
    assert [s["n_cached_tokens"] for s in _get(server.url + "/slots")] == before
    assert _metric(server, "prompt_tokens_cached_total") == cached


def test_disconnect_mid_stream_frees_the_slot(server):
    _wait_idle(server)
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps(
        {"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}
    ).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    got = b""
    while got.count(b"data: ") < 3:  # the stream is running
        got += s.recv(4096)
    assert any(x["is_processing"] for x in _get(server.url + "/slots"))
    s.close()
    _wait_idle(server, timeout=10)  # far sooner than 400 tokens would take
    assert _metric(server, "requests_processing") == 0


def test_disconnect_while_waiting_for_a_whole_answer_frees_the_slot(server):
    _wait_idle(server)
    port = int(server.url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": "Once", "max_tokens": 400, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    deadline = time.monotonic() + 30
    while not any(x["is_processing"] for x in _get(server.url + "/slots")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.close()
    _wait_idle(server, timeout=10)


def test_tokenize_detokenize_round_trip(server):
    tok = server.model.tokenizer
    r = _post(server.url + "/tokenize", {"content": "Hello little dog", "with_pieces": True})
    ids = [t["id"] for t in r["tokens"]]
    assert ids == tok.encode("Hello little dog", add_special=False)
    assert "".join(t["piece"] for t in r["tokens"]).strip() == "Hello little dog"
    assert _post(server.url + "/detokenize", {"tokens": ids})["content"].strip() == (
        "Hello little dog"
    )


def test_props_name_the_model_context_and_active_plugins(server):
    props = _get(server.url + "/props")
    assert props["n_ctx"] == 512 and props["total_slots"] == 3
    assert props["backend"] == "numpy" and props["kv_path"] in ("rows", "dense")
    names = {p["name"] for p in props["plugins"]}
    assert {"server", "backend-numpy", "arch-llama"} <= names
    assert props["model_path"].endswith("tessera-default.gguf")


def test_metrics_are_prometheus_text(server):
    text = _get(server.url + "/metrics").decode()
    assert "# TYPE tessera:tokens_predicted_total counter" in text
    assert "# TYPE tessera:kv_cache_usage_ratio gauge" in text
    assert _metric(server, "slots_total") == 3


@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM is a POSIX signal")
def test_sigterm_lets_in_flight_requests_finish_then_exits_cleanly(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera",
            "serve",
            "--backend",
            "numpy",
            "-c",
            "256",
            "--port",
            str(port),
            "--slot-save-path",
            str(tmp_path),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        # the start-up lines: the model summary, then the address
        assert f"http://127.0.0.1:{port}" in proc.stderr.readline() + proc.stderr.readline()
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/health")
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        s = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"prompt": "Once", "max_tokens": 20, "temperature": 0}).encode()
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")
        payload = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert payload["usage"]["completion_tokens"] >= 1
        assert proc.wait(60) == 0
        assert not list(tmp_path.iterdir())  # nothing half-written
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("spec_type", ["ngram", "draft"])
def test_speculative_serving_gives_the_plain_tokens_and_counts_drafts(server, spec_type):
    from openai import OpenAI

    from tessera.plugins.server.testing import live_server

    kw = dict(model="m", prompt="def main():", max_tokens=24, temperature=0)
    plain = OpenAI(base_url=server.v1, api_key="x").completions.create(**kw)
    argv = ["--backend", "numpy", "-np", "2", "-c", "512", "--spec-type", spec_type]
    argv += ["--draft-p-min", "0.3"]
    with live_server(argv) as spec:
        r = OpenAI(base_url=spec.v1, api_key="x").completions.create(**kw)
        assert r.choices[0].text == plain.choices[0].text
        assert _metric(spec, "spec_drafted_total") > 0
        assert _metric(spec, "spec_accepted_total") > 0
        assert _metric(spec, "n_decode_total") < r.usage.completion_tokens


def test_the_moe_expert_cache_counters_are_in_metrics():
    from openai import OpenAI

    from tessera.files.load import default_model_path
    from tessera.plugins.server.testing import live_server

    moe = default_model_path().parent / "tessera-moe.gguf"
    argv = ["-m", str(moe), "--backend", "numpy", "-np", "1", "-c", "256"]
    argv += ["--cpu-moe", "--moe-cache-mib", "64"]
    with live_server(argv) as srv:
        OpenAI(base_url=srv.v1, api_key="x").completions.create(
            model="m", prompt="Once upon a time", max_tokens=8, temperature=0
        )
        hits, misses = _metric(srv, "moe_cache_hits_total"), _metric(srv, "moe_cache_misses_total")
        stats = srv.model.model.experts.cache.stats()
    assert misses > 0 and hits > 0  # 8 tokens through the same layers: experts come back
    assert (hits, misses) == (stats["hits"], stats["misses"])

"""Serving several models: the model field routes, /v1/models lists them, models load on
demand (one load for concurrent requests), at most --models-max stay loaded (least
recently used out), and a model with a request in flight is never unloaded."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from conftest import MODELS, call, rows, server_argv, unload_all, wait_for

from tessera.files.load import default_model_path
from tessera.plugins.server.testing import live_server


def _chat(srv, model: str, max_tokens: int = 6, stream: bool = False) -> tuple[int, dict]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me about the for statement."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    return call(srv.v1 + "/chat/completions", body)


def test_v1_models_lists_every_model_with_its_state(server):
    unload_all(server)
    status, body = call(server.v1 + "/models")
    assert status == 200
    ids = {m["id"]: m for m in body["data"]}
    assert set(ids) == set(MODELS) | {"tessera-default.gguf"}
    assert all(m["status"] == {"value": "unloaded"} for m in ids.values())
    assert _chat(server, "alpha.gguf")[0] == 200
    ids = {m["id"]: m for m in call(server.v1 + "/models")[1]["data"]}
    assert ids["alpha.gguf"]["status"]["value"] == "loaded"
    assert ids["alpha.gguf"]["context_length"] == 256


def test_model_field_routes_to_that_model(server, model_sources):
    """The answer of model X equals that of a single-model server on X (greedy, numpy)."""
    status, multi = _chat(server, "beta-q8.gguf")
    assert status == 200, multi
    assert multi["model"] == "beta-q8.gguf"
    argv = ["--backend", "numpy", "-m", str(model_sources["beta-q8.gguf"])]
    with live_server([*argv, "-c", "256", "-np", "2", "-b", "64"]) as single:
        status, alone = _chat(single, "whatever")
    assert status == 200
    assert multi["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    other = _chat(server, "alpha.gguf")[1]["choices"][0]["message"]["content"]
    assert other != alone["choices"][0]["message"]["content"]


def test_unknown_model_is_404_listing_the_available_ones(server):
    status, body = _chat(server, "missing.gguf")
    assert status == 404
    assert body["error"]["param"] == "model"
    assert body["error"]["code"] == "model_not_found"
    for name in [*MODELS, "tessera-default.gguf"]:
        assert name in body["error"]["message"]


def test_least_recently_used_model_is_unloaded_first(server):
    unload_all(server)
    assert _chat(server, "alpha.gguf")[0] == 200
    assert _chat(server, "beta-q8.gguf")[0] == 200
    assert _chat(server, "gamma.gguf")[0] == 200  # third with --models-max 2: alpha out
    states = {n: m["state"] for n, m in rows(server).items()}
    assert states["alpha.gguf"] == "on_disk"
    assert states["beta-q8.gguf"] == states["gamma.gguf"] == "loaded"
    assert _chat(server, "beta-q8.gguf")[0] == 200  # beta is now the most recent
    assert _chat(server, "alpha.gguf")[0] == 200  # so gamma goes
    states = {n: m["state"] for n, m in rows(server).items()}
    assert states == {
        "alpha.gguf": "loaded",
        "beta-q8.gguf": "loaded",
        "gamma.gguf": "on_disk",
        "tessera-default.gguf": "on_disk",
    }
    assert len(server.state.pool.served()) == 2


def test_concurrent_requests_for_one_model_load_it_once(server):
    unload_all(server)
    pool = server.state.pool
    loads: list[str] = []
    real_loader = pool.loader

    def counting_loader(name, path):
        loads.append(name)
        time.sleep(0.3)  # the others arrive while it loads
        return real_loader(name, path)

    pool.loader = counting_loader
    try:
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_chat(server, "gamma.gguf")[0]))
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        pool.loader = real_loader
    assert results == [200, 200, 200]
    assert loads == ["gamma.gguf"]


def test_a_model_with_a_request_in_flight_is_never_unloaded(server):
    unload_all(server)
    assert call(server.url + "/api/models/load", {"model": "alpha.gguf"})[0] == 200
    assert call(server.url + "/api/models/load", {"model": "beta-q8.gguf"})[0] == 200
    pool = server.state.pool
    alpha = pool.entry("alpha.gguf")
    alpha.last_used = 0.0  # least recently used: the first to go, were it idle
    gate = threading.Event()
    blocker = threading.Thread(target=alpha.served.engine.call, args=(gate.wait,))
    blocker.start()  # holds alpha's engine thread: its request stays in flight
    answer: list[tuple[int, dict]] = []
    request = threading.Thread(target=lambda: answer.append(_chat(server, "alpha.gguf", 4)))
    request.start()
    try:
        wait_for(lambda: pool.busy(alpha), what="alpha's request in flight")
        status, body = call(server.url + "/api/models/unload", {"model": "alpha.gguf"})
        assert status == 409 and "answering requests" in body["error"]["message"]
        status, body = call(
            server.url + "/api/models/delete", {"model": "alpha.gguf", "force": True}
        )
        assert status == 409
        assert _chat(server, "gamma.gguf")[0] == 200  # beta, idle, goes instead of alpha
        states = {n: m["state"] for n, m in rows(server).items()}
        assert states["alpha.gguf"] == "loaded" and states["gamma.gguf"] == "loaded"
        assert states["beta-q8.gguf"] == "on_disk"
        assert rows(server)["alpha.gguf"]["in_use"] is True
    finally:
        gate.set()
        blocker.join(60)
        request.join(120)
    assert answer[0][0] == 200
    wait_for(lambda: not pool.busy(alpha), what="alpha idle")
    assert call(server.url + "/api/models/unload", {"model": "alpha.gguf"})[0] == 200


def test_streaming_works_through_the_pool(server):
    req = urllib.request.Request(
        server.v1 + "/chat/completions",
        data=json.dumps(
            {
                "model": "gamma.gguf",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
                "stream": True,
                "temperature": 0,
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        lines = [ln for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert {c["model"] for c in chunks} == {"gamma.gguf"}
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 1


def test_several_m_flags_serve_several_models(model_sources):
    argv = ["--backend", "numpy", "-c", "128", "-np", "1"]
    argv += ["-m", str(model_sources["alpha.gguf"]), "-m", str(default_model_path())]
    with live_server(argv) as srv:
        ids = [m["id"] for m in call(srv.v1 + "/models")[1]["data"]]
        assert ids == ["alpha.gguf", "tessera-default.gguf"]
        assert _chat(srv, "tessera-default.gguf")[0] == 200
        status, body = call(srv.url + "/api/models/delete", {"model": "alpha.gguf"})
        assert status == 403 and "models directory" in body["error"]["message"]
        assert model_sources["alpha.gguf"].exists()


def test_the_models_managers_load_works_without_autoload(models_dir):
    with live_server(server_argv(models_dir, "--no-models-autoload")) as srv:
        status, body = _chat(srv, "alpha.gguf")
        assert status == 400 and "is not loaded" in body["error"]["message"]
        assert call(srv.url + "/api/models/load", {"model": "alpha.gguf"})[0] == 200
        assert _chat(srv, "alpha.gguf")[0] == 200

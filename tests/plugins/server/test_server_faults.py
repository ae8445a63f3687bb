"""A request that raises inside the engine fails alone (500, or an error event then
``[DONE]`` on a stream) and the server goes on serving; a dead engine makes /health 503,
and the watchdog stops the server so that a supervisor restarts it."""

from __future__ import annotations

import json
import types
import urllib.error
import urllib.request

import pytest

from tessera.engine.sampling import Sampler
from tessera.plugins.server.watchdog import Watchdog

POISON_SEED = 4242  # the seed of the requests whose sampling raises below


@pytest.fixture
def poisoned(monkeypatch):
    sample = Sampler.sample

    def poisoned_sample(self, logits, history):
        if self.params.seed == POISON_SEED:
            raise FloatingPointError("sampling blew up")
        return sample(self, logits, history)

    monkeypatch.setattr(Sampler, "sample", poisoned_sample)


def _post(url: str, payload: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _completion(seed: int | None = None, stream: bool = False) -> dict:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.0, "stream": stream}
    return body if seed is None else {**body, "seed": seed}


def _still_serving(server) -> None:
    """A normal request gets the same greedy answer twice, and nothing is left running."""
    answers = []
    for _ in range(2):
        status, body = _post(server.v1 + "/completions", _completion())
        assert status == 200, body
        choice = json.loads(body)["choices"][0]
        assert choice["finish_reason"] in ("length", "stop") and choice["text"]
        answers.append(choice["text"])
    assert answers[0] == answers[1]
    assert _get(server.url + "/health") == (200, {"status": "ok"})
    assert not any(s["is_processing"] for s in _get(server.url + "/slots")[1])


def test_a_request_that_raises_is_a_500_and_the_server_goes_on(server, poisoned):
    status, body = _post(server.v1 + "/completions", _completion(POISON_SEED))
    assert status == 500
    error = json.loads(body)["error"]
    assert "sampling blew up" in error["message"] and error["type"] == "server_error"
    _still_serving(server)


def test_a_stream_that_raises_ends_with_an_error_event_and_done(server, poisoned):
    status, body = _post(server.v1 + "/completions", _completion(POISON_SEED, stream=True))
    assert status == 200
    events = [line[len("data: ") :] for line in body.decode().splitlines() if line]
    assert events[-1] == "[DONE]"
    assert "sampling blew up" in json.loads(events[-2])["error"]["message"]
    _still_serving(server)


def test_health_is_503_with_the_reason_when_the_engine_is_dead(server, monkeypatch):
    engine = server.model.engine
    monkeypatch.setattr(engine, "failure", "RuntimeError: test")
    status, body = _get(server.url + "/health")
    assert (
        status == 503
        and "the engine thread stopped: RuntimeError: test" in (body["error"]["message"])
    )
    status, body = _post(server.v1 + "/completions", _completion())
    assert status == 503 and b"restart the server" in body


def test_the_watchdog_stops_the_server_when_an_engine_is_unhealthy():
    engine = types.SimpleNamespace(health=lambda: (False, "no decode step for 700 s"))
    served = types.SimpleNamespace(name="m.gguf", engine=engine)
    state = types.SimpleNamespace(pool=types.SimpleNamespace(served=lambda: [served]))
    srv = types.SimpleNamespace(should_exit=False)
    watchdog = Watchdog(state, srv, every_s=0.01)
    watchdog.watch()
    assert srv.should_exit and watchdog.reason == "model 'm.gguf': no decode step for 700 s"


def test_the_watchdog_leaves_a_healthy_server_alone():
    engine = types.SimpleNamespace(health=lambda: (True, "ok"))
    state = types.SimpleNamespace(
        pool=types.SimpleNamespace(served=lambda: [types.SimpleNamespace(name="m", engine=engine)])
    )
    watchdog = Watchdog(state, types.SimpleNamespace(should_exit=False))
    assert watchdog.check() is None

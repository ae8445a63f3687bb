"""Router mode as llama-server's: ``tessera serve --models-dir`` over random-weight GGUFs,
driven through httpx. GET /models gives each model llama-server's status object,
POST /models/load and /models/unload answer ``{"success": true}`` (or llama-server's
error shape), --no-models-autoload and ``?autoload=`` decide whether a request loads a
model, ``?model=`` picks the model of a GET route, and GET /props without it is the
router's own."""

from __future__ import annotations

import time

import httpx
import pytest

from tessera.plugins.server.testing import live_server
from tessera.testing.models import make_gguf

NAMES = ("alpha.gguf", "beta.gguf", "gamma.gguf")
CHAT = {"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 4}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("router-models")
    for seed, name in enumerate(NAMES, 1):
        make_gguf(d / name, seed=seed)
    data = (d / "alpha.gguf").read_bytes()
    (d / "broken.gguf").write_bytes(data[: len(data) // 2])
    return d


def _argv(models_dir, *extra: str) -> list[str]:
    return ["--backend", "numpy", "--models-dir", str(models_dir), "-c", "128", "-np", "1",
            "-b", "64", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def manual(models_dir):
    """A router that loads models only when told to (--no-models-autoload)."""
    with live_server(_argv(models_dir, "--no-models-autoload", "--models-max", "2")) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            yield client


def _statuses(client: httpx.Client) -> dict[str, dict]:
    r = client.get("/models")
    assert r.status_code == 200
    return {m["id"]: m["status"] for m in r.json()["data"]}


def _wait_status(client: httpx.Client, name: str, value: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _statuses(client)[name]
        if status["value"] == value:
            return status
        time.sleep(0.05)
    raise AssertionError(f"{name} never became {value}: {_statuses(client)[name]}")


def _unload_all(client: httpx.Client) -> None:
    for name, status in _statuses(client).items():
        if status["value"] == "loaded":
            assert client.post("/models/unload", json={"model": name}).json() == {"success": True}


def test_models_lists_every_model_unloaded_with_its_architecture(manual):
    _unload_all(manual)
    data = {m["id"]: m for m in manual.get("/models").json()["data"]}
    assert set(data) == {*NAMES, "broken.gguf"}
    for name in NAMES:
        assert data[name]["status"] == {"value": "unloaded"}
        assert data[name]["architecture"]["input_modalities"] == ["text"]
    # /v1/models is the same list, as llama-server's router answers both
    assert manual.get("/v1/models").json()["data"] == manual.get("/models").json()["data"]


def test_load_answers_success_and_the_model_becomes_loaded(manual):
    _unload_all(manual)
    r = manual.post("/models/load", json={"model": "alpha.gguf"})
    assert r.status_code == 200 and r.json() == {"success": True}
    assert _wait_status(manual, "alpha.gguf", "loaded") == {"value": "loaded"}
    item = next(m for m in manual.get("/models").json()["data"] if m["id"] == "alpha.gguf")
    assert item["context_length"] == 128  # the loaded model's own facts join its entry
    assert (
        manual.post("/v1/chat/completions", json={"model": "alpha.gguf", **CHAT}).status_code == 200
    )


def test_loading_a_loaded_model_or_unloading_one_not_loaded_is_400(manual):
    _unload_all(manual)
    r = manual.post("/models/unload", json={"model": "beta.gguf"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert "'beta.gguf' is not loaded" in error["message"]
    assert manual.post("/models/load", json={"model": "beta.gguf"}).json() == {"success": True}
    _wait_status(manual, "beta.gguf", "loaded")
    r = manual.post("/models/load", json={"model": "beta.gguf"})
    assert r.status_code == 400 and "already loaded" in r.json()["error"]["message"]
    assert manual.post("/models/unload", json={"model": "beta.gguf"}).json() == {"success": True}
    assert _statuses(manual)["beta.gguf"] == {"value": "unloaded"}


def test_an_unknown_or_missing_model_is_refused(manual):
    r = manual.post("/models/load", json={"model": "missing.gguf"})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    assert "available models: alpha.gguf" in r.json()["error"]["message"]
    r = manual.post("/models/unload", json={})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_a_failed_load_is_unloaded_with_failed_true(manual):
    assert manual.post("/models/load", json={"model": "broken.gguf"}).json() == {"success": True}
    status = _wait_status(manual, "broken.gguf", "unloaded")
    deadline = time.monotonic() + 60
    while "failed" not in status and time.monotonic() < deadline:
        time.sleep(0.05)  # "unloaded" before the load began, then loading, then failed
        status = _statuses(manual)["broken.gguf"]
    assert status["failed"] is True and status["exit_code"] == 1
    assert "truncated" in status["error"]


def test_without_autoload_a_request_for_an_unloaded_model_is_refused(manual):
    _unload_all(manual)
    r = manual.post("/v1/chat/completions", json={"model": "gamma.gguf", **CHAT})
    assert r.status_code == 400
    assert "'gamma.gguf' is not loaded" in r.json()["error"]["message"]
    assert "POST /models/load" in r.json()["error"]["message"]
    assert manual.get("/props", params={"model": "gamma.gguf"}).status_code == 400
    assert _statuses(manual)["gamma.gguf"] == {"value": "unloaded"}
    # ?autoload=true overrides the server's setting for one request
    r = manual.get("/props", params={"model": "gamma.gguf", "autoload": "true"})
    assert r.status_code == 200 and r.json()["model_alias"] == "gamma.gguf"
    assert _statuses(manual)["gamma.gguf"] == {"value": "loaded"}


def test_props_without_model_is_the_routers_own(manual):
    props = manual.get("/props").json()
    assert props["role"] == "router"
    assert props["max_instances"] == 2 and props["models_autoload"] is False
    assert props["default_generation_settings"] == {"params": {}, "n_ctx": 0}


def test_model_query_parameter_picks_the_model_of_get_routes(manual):
    for name in ("alpha.gguf", "beta.gguf"):
        if _statuses(manual)[name]["value"] != "loaded":
            manual.post("/models/load", json={"model": name})
            _wait_status(manual, name, "loaded")
        props = manual.get("/props", params={"model": name}).json()
        assert props["model_alias"] == name and props["n_ctx"] == 128
        r = manual.get("/metrics", params={"model": name})
        assert r.status_code == 200 and "tessera:requests_total" in r.text
        slots = manual.get("/slots", params={"model": name}).json()
        assert len(slots) == 1


def test_models_max_unloads_the_least_recently_used(manual):
    _unload_all(manual)
    for name in NAMES:
        assert manual.post("/models/load", json={"model": name}).json() == {"success": True}
        _wait_status(manual, name, "loaded")
    loaded = [n for n, s in _statuses(manual).items() if s["value"] == "loaded"]
    assert sorted(loaded) == ["beta.gguf", "gamma.gguf"]  # --models-max 2: alpha left


def test_with_autoload_a_request_loads_its_model_unless_it_says_autoload_false(models_dir):
    with live_server(_argv(models_dir, "--models-max", "0")) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            r = client.post("/v1/chat/completions?autoload=false",
                            json={"model": "alpha.gguf", **CHAT})  # fmt: skip
            assert r.status_code == 400 and "is not loaded" in r.json()["error"]["message"]
            for name in NAMES:  # --models-max 0: no limit, all three stay
                r = client.post("/v1/chat/completions", json={"model": name, **CHAT})
                assert r.status_code == 200, r.text
            statuses = _statuses(client)
            assert all(statuses[n] == {"value": "loaded"} for n in NAMES)
            assert client.get("/props").json()["models_autoload"] is True
            assert client.get("/props").json()["max_instances"] == 0


def test_a_single_model_server_has_no_router_routes(server):
    r = httpx.post(server.url + "/models/load", json={"model": "x"}, timeout=60)
    assert r.status_code == 400 and "--models-dir" in r.json()["error"]["message"]
    assert "role" not in httpx.get(server.url + "/props", timeout=60).json()

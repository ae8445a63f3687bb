"""Tiny random-weight models in a models directory, and a multi-model server over them
(numpy backend: deterministic), a JSON helper for the API, and for the browser tests a
headless Chromium (Debian's chromium + chromedriver, driven by Selenium) and the folder
their screenshots go to ($TESSERA_SCREENSHOT_DIR, default: a pytest temporary folder)."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tessera.files.load import default_model_path
from tessera.plugins.server.testing import live_server
from tessera.testing.models import make_gguf

#: name -> (make_gguf keyword arguments)
MODELS = {
    "alpha.gguf": {"seed": 1},
    "beta-q8.gguf": {"seed": 2, "qtype": "q8_0"},
    "gamma.gguf": {"seed": 3, "n_layer": 1},
}


def call(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, dict]:
    """GET (no body) or POST JSON; (status, decoded JSON answer)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def rows(srv) -> dict[str, dict]:
    status, body = call(srv.url + "/api/models")
    assert status == 200, body
    return {m["name"]: m for m in body["models"]}


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def unload_all(srv) -> None:
    for name, m in rows(srv).items():
        if m["state"] == "loaded":
            assert call(srv.url + "/api/models/unload", {"model": name})[0] == 200


@pytest.fixture(scope="session")
def model_sources(tmp_path_factory) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("model-sources")
    return {name: make_gguf(src / name, **kwargs) for name, kwargs in MODELS.items()}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, model_sources) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name, path in model_sources.items():
        shutil.copyfile(path, d / name)
    return d


def server_argv(models_dir: Path, *extra: str) -> list[str]:
    return [
        "--backend", "numpy", "--models-dir", str(models_dir), "--models-max", "2",
        "-m", str(default_model_path()), "-c", "256", "-np", "2", "-b", "64", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def server(models_dir):
    with live_server(server_argv(models_dir)) as srv:
        yield srv


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing; install Debian's chromium and chromium-driver (make test)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed; pip install -e .[test]"
    return None


@pytest.fixture(scope="module")
def downloads_dir(tmp_path_factory) -> Path:
    """Where the browser saves what the page downloads (exported conversations)."""
    return tmp_path_factory.mktemp("browser-downloads")


@pytest.fixture(scope="module")
def driver(downloads_dir):
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"browser tests cannot run in CI: {missing}")
        # Real skip, outside CI only: a developer machine without Chromium (make test
        # installs it); in CI the same condition fails above.
        pytest.skip(missing)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1200,820")
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads_dir), "download.prompt_for_download": False},
    )
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    d.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads_dir)}
    )
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    given = os.environ.get("TESSERA_SCREENSHOT_DIR")
    path = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path

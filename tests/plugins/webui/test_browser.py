"""The web UI in a real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium): the Models Manager's table and actions, the chat page's streaming and stop
button, and a download broken midway and resumed. Screenshots of both pages are saved
under $TESSERA_SCREENSHOT_DIR (default: a pytest temporary directory)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import call, rows, server_argv

from tessera.engine.slots import SlotEngine
from tessera.plugins.server.testing import live_server
from tessera.testing.http_files import file_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing; install Debian's chromium and chromium-driver (make test)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed; pip install -e .[test]"
    return None


@pytest.fixture(scope="module")
def driver():
    missing = _missing()
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
    options.add_argument("--window-size=1280,900")
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    given = os.environ.get("TESSERA_SCREENSHOT_DIR")
    path = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def ui_server(models_dir):
    with live_server(server_argv(models_dir)) as srv:
        yield srv


def _wait(driver, predicate, timeout: float = 30.0, what: str = ""):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d):
        try:
            return predicate(d)
        except StaleElementReferenceException:  # the table re-rendered meanwhile
            return False

    return WebDriverWait(driver, timeout, 0.05).until(safe, what)


def _css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def _table_names(driver) -> list[str]:
    return [r.get_attribute("data-name") for r in _css(driver, "#models-table tbody tr")]


def _click(driver, selector: str) -> None:
    _wait(driver, lambda d: _css(d, selector) and (_css(d, selector)[0].click() or True),
          what=f"click {selector}")  # fmt: skip


def _open_models(driver, url: str) -> None:
    driver.get(url + "/#models")
    _wait(driver, lambda d: len(_table_names(d)) > 0, what="the models table")


def test_models_manager_sort_filter_load_hide_favourite(driver, ui_server, shots):
    srv = ui_server
    _open_models(driver, srv.url)
    api = rows(srv)
    visible = sorted(api)
    assert _table_names(driver) == visible  # by name, ascending
    _click(driver, '#models-table th[data-key="size"]')
    by_size = sorted(api, key=lambda n: (api[n]["size"], n))
    _wait(driver, lambda d: _table_names(d) == by_size, what="sorted by size")
    _click(driver, '#models-table th[data-key="size"]')
    _wait(driver, lambda d: _table_names(d) == by_size[::-1], what="sorted by size, descending")
    filt = _css(driver, "#models-filter")[0]
    filt.send_keys("q8_0")
    _wait(driver, lambda d: _table_names(d) == ["beta-q8.gguf"], what="filtered")
    filt.clear()
    filt.send_keys(" ")  # an input event with an empty filter
    _wait(driver, lambda d: len(_table_names(d)) == len(api), what="filter cleared")

    _click(driver, 'tr[data-name="tessera-default.gguf"] button[data-action="load"]')
    _wait(driver, lambda d: _css(d, 'tr[data-name="tessera-default.gguf"][data-state="loaded"]'),
          timeout=60, what="loaded")  # fmt: skip
    assert rows(srv)["tessera-default.gguf"]["state"] == "loaded"
    _click(driver, 'tr[data-name="gamma.gguf"] button[data-action="hide"]')
    _wait(driver, lambda d: "gamma.gguf" not in _table_names(d), what="gamma hidden")
    _click(driver, 'tr[data-name="alpha.gguf"] button[data-action="favourite"]')
    fav = 'tr[data-name="alpha.gguf"] button.fav'
    _wait(driver, lambda d: _css(d, fav)[0].text == "\u2605", what="alpha favourite")

    driver.refresh()  # the flags come back from the server's state file
    _wait(driver, lambda d: "alpha.gguf" in _table_names(d), what="table after reload")
    assert "gamma.gguf" not in _table_names(driver)
    assert _css(driver, fav)[0].text == "\u2605"
    _click(driver, "#show-hidden")
    _wait(driver, lambda d: _css(d, 'tr.hidden-model[data-name="gamma.gguf"]'), what="hidden row")
    listed = rows(srv)
    assert listed["gamma.gguf"]["hidden"] and listed["alpha.gguf"]["favourite"]
    driver.save_screenshot(str(shots / "models-manager.png"))
    # back to plain flags for the other tests
    call(srv.url + "/api/models/hide", {"model": "gamma.gguf", "hidden": False})


def test_chat_streams_the_models_answer_and_stop_ends_it(driver, ui_server, shots, monkeypatch):
    from selenium.webdriver.support.ui import Select

    srv = ui_server
    driver.get(srv.url + "/#chat")
    _wait(driver, lambda d: len(Select(_css(d, "#chat-model")[0]).options) >= 4, what="picker")
    Select(_css(driver, "#chat-model")[0]).select_by_value("tessera-default.gguf")
    for selector, value in (("#chat-temp", "0"), ("#chat-max-tokens", "40")):
        box = _css(driver, selector)[0]
        box.clear()
        box.send_keys(value)
    prompt = "Tell me about the for statement."
    _css(driver, "#chat-input")[0].send_keys(prompt)
    _click(driver, "#chat-send")
    answer = _wait(driver, lambda d: _css(d, '.msg.assistant[data-state="done"]'), timeout=60,
                   what="the answer")[0]  # fmt: skip
    body = {"model": "tessera-default.gguf", "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "max_tokens": 40}  # fmt: skip
    expected = call(srv.v1 + "/chat/completions", body)[1]["choices"][0]["message"]["content"]
    text = driver.execute_script("return arguments[0].firstChild.textContent", answer)
    assert text == expected and len(expected) > 10
    assert int(answer.get_attribute("data-chunks")) > 1  # arrived in pieces
    driver.save_screenshot(str(shots / "chat.png"))

    # Stop: gamma's engine thread is held right after its first token, so the click lands
    # mid-answer however fast the model is
    gate, first_token = threading.Event(), threading.Event()
    emit_token = SlotEngine.emit_token

    def emit_then_hold(engine, slot, event):
        emit_token(engine, slot, event)
        if engine.ctx.model.path.name == "gamma.gguf" and not first_token.is_set():
            first_token.set()
            gate.wait(60)

    monkeypatch.setattr(SlotEngine, "emit_token", emit_then_hold)
    Select(_css(driver, "#chat-model")[0]).select_by_value("gamma.gguf")
    box = _css(driver, "#chat-max-tokens")[0]
    box.clear()
    box.send_keys("200")
    _css(driver, "#chat-input")[0].send_keys("Go on.")
    _click(driver, "#chat-send")
    second = ".msg.assistant:nth-of-type(4)"
    try:
        _wait(driver, lambda d: _css(d, second) and _css(d, second)[0].get_attribute("data-chunks"),
              timeout=60, what="the first piece")  # fmt: skip
        engine = srv.state.pool.entry("gamma.gguf").served.engine
        _click(driver, "#chat-stop")
        _wait(driver, lambda d: _css(d, second)[0].get_attribute("data-state") == "stopped",
              what="stopped")  # fmt: skip
    finally:
        gate.set()
    n_chunks = int(_css(driver, second)[0].get_attribute("data-chunks"))
    assert n_chunks < 200
    # the server saw the client go away and freed the slot before the 200 tokens
    _wait(driver, lambda d: all(s.task is None for s in engine.slots), what="slot freed")
    assert engine.metrics.n_tokens_predicted < 200 + 40
    assert _css(driver, "#chat-send")[0].is_enabled()


def test_download_broken_midway_is_resumed_and_appears(driver, ui_server, model_sources, shots):
    srv = ui_server
    data = model_sources["gamma.gguf"].read_bytes()
    with file_server({"fresh.gguf": data}) as (base, control):
        control.cut_at["fresh.gguf"] = len(data) // 2
        _open_models(driver, srv.url)
        _css(driver, "#dl-url")[0].send_keys(base + "/fresh.gguf")
        _click(driver, "#dl-start")
        row = '#downloads-table tr[data-state="interrupted"]'
        _wait(driver, lambda d: _css(d, row), what="the broken download")
        driver.save_screenshot(str(shots / "models-download-interrupted.png"))
        assert "fresh.gguf" not in _table_names(driver)
        _click(driver, row + ' button[data-action="dl-resume"]')
        _wait(driver, lambda d: _css(d, '#downloads-table tr[data-state="done"]'), what="done")
        _wait(driver, lambda d: "fresh.gguf" in _table_names(d), what="the new model's row")
    models_dir = Path(srv.state.pool.models_dir)
    assert (models_dir / "fresh.gguf").read_bytes() == data
    assert control.requests[1][1] == f"bytes={len(data) // 2}-"
    driver.save_screenshot(str(shots / "models-download.png"))

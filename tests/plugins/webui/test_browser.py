"""The Models Manager in a real headless Chromium: its table (sort, filters by text,
architecture and quant type, load, hide, favourite), a model's metadata, and downloads (one
broken midway and resumed, one that never connects). Screenshots are saved under
$TESSERA_SCREENSHOT_DIR (default: a pytest temporary directory)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from conftest import call, rows, server_argv
from webui_browser import click, css, wait

from tessera.files.gguf import read_gguf
from tessera.plugins.server.testing import live_server
from tessera.testing.http_files import file_server
from tessera.testing.models import make_gguf


@pytest.fixture(scope="module")
def ui_server(models_dir, tmp_path_factory):
    # one model of another architecture and quant type, for the filters
    src = make_gguf(
        tmp_path_factory.mktemp("qwen") / "delta-qwen2.gguf", "qwen2", seed=4, qtype="q4_0"
    )
    shutil.copyfile(src, models_dir / "delta-qwen2.gguf")
    with live_server(server_argv(models_dir)) as srv:
        yield srv


def _table_names(driver) -> list[str]:
    return [r.get_attribute("data-name") for r in css(driver, "#models-table tbody tr")]


def _open_models(driver, url: str) -> None:
    driver.get(url + "/#models")
    wait(driver, lambda d: len(_table_names(d)) > 0, what="the models table")


def test_models_manager_sort_filter_load_hide_favourite(driver, ui_server, shots):
    srv = ui_server
    _open_models(driver, srv.url)
    api = rows(srv)
    visible = sorted(api)
    assert _table_names(driver) == visible  # by name, ascending
    click(driver, '#models-table th[data-key="size"]')
    by_size = sorted(api, key=lambda n: (api[n]["size"], n))
    wait(driver, lambda d: _table_names(d) == by_size, what="sorted by size")
    click(driver, '#models-table th[data-key="size"]')
    wait(driver, lambda d: _table_names(d) == by_size[::-1], what="sorted by size, descending")
    filt = css(driver, "#models-filter")[0]
    filt.send_keys("q8_0")
    wait(driver, lambda d: _table_names(d) == ["beta-q8.gguf"], what="filtered")
    filt.clear()
    filt.send_keys(" ")  # an input event with an empty filter
    wait(driver, lambda d: len(_table_names(d)) == len(api), what="filter cleared")

    click(driver, 'tr[data-name="tessera-default.gguf"] button[data-action="load"]')
    wait(driver, lambda d: css(d, 'tr[data-name="tessera-default.gguf"][data-state="loaded"]'),
          timeout=60, what="loaded")  # fmt: skip
    assert rows(srv)["tessera-default.gguf"]["state"] == "loaded"
    click(driver, 'tr[data-name="gamma.gguf"] button[data-action="hide"]')
    wait(driver, lambda d: "gamma.gguf" not in _table_names(d), what="gamma hidden")
    click(driver, 'tr[data-name="alpha.gguf"] button[data-action="favourite"]')
    fav = 'tr[data-name="alpha.gguf"] button.fav'
    wait(driver, lambda d: css(d, fav)[0].text == "\u2605", what="alpha favourite")

    driver.refresh()  # the flags come back from the server's state file
    wait(driver, lambda d: "alpha.gguf" in _table_names(d), what="table after reload")
    assert "gamma.gguf" not in _table_names(driver)
    assert css(driver, fav)[0].text == "\u2605"
    click(driver, "#show-hidden")
    wait(driver, lambda d: css(d, 'tr.hidden-model[data-name="gamma.gguf"]'), what="hidden row")
    listed = rows(srv)
    assert listed["gamma.gguf"]["hidden"] and listed["alpha.gguf"]["favourite"]
    driver.save_screenshot(str(shots / "models-manager.png"))
    # back to plain flags for the other tests
    call(srv.url + "/api/models/hide", {"model": "gamma.gguf", "hidden": False})


def test_download_broken_midway_is_resumed_and_appears(driver, ui_server, model_sources, shots):
    srv = ui_server
    data = model_sources["gamma.gguf"].read_bytes()
    with file_server({"fresh.gguf": data}) as (base, control):
        control.cut_at["fresh.gguf"] = len(data) // 2
        _open_models(driver, srv.url)
        css(driver, "#dl-url")[0].send_keys(base + "/fresh.gguf")
        click(driver, "#dl-start")
        row = '#downloads-table tr[data-state="interrupted"]'
        wait(driver, lambda d: css(d, row), what="the broken download")
        driver.save_screenshot(str(shots / "models-download-interrupted.png"))
        assert "fresh.gguf" not in _table_names(driver)
        click(driver, row + ' button[data-action="dl-resume"]')
        wait(driver, lambda d: css(d, '#downloads-table tr[data-state="done"]'), what="done")
        wait(driver, lambda d: "fresh.gguf" in _table_names(d), what="the new model's row")
    models_dir = Path(srv.state.pool.models_dir)
    assert (models_dir / "fresh.gguf").read_bytes() == data
    assert control.requests[1][1] == f"bytes={len(data) // 2}-"
    driver.save_screenshot(str(shots / "models-download.png"))


def test_filters_by_architecture_and_quant_type(driver, ui_server):
    from selenium.webdriver.support.ui import Select

    srv = ui_server
    _open_models(driver, srv.url)
    api = rows(srv)
    arch = Select(css(driver, "#models-arch")[0])
    quant = Select(css(driver, "#models-quant")[0])
    wait(driver, lambda d: len(arch.options) > 2, what="the architectures")
    assert [o.get_attribute("value") for o in arch.options] == ["", "llama", "qwen2"]
    assert {o.get_attribute("value") for o in quant.options} == {""} | {
        m["quant"] for m in api.values()
    }
    arch.select_by_value("qwen2")
    wait(driver, lambda d: _table_names(d) == ["delta-qwen2.gguf"], what="qwen2 only")
    arch.select_by_value("llama")
    quant.select_by_value("F32")
    f32_llama = sorted(n for n, m in api.items() if m["arch"] == "llama" and m["quant"] == "F32")
    wait(driver, lambda d: _table_names(d) == f32_llama, what="llama F32 models")
    assert "beta-q8.gguf" not in f32_llama and len(f32_llama) >= 2
    arch.select_by_value("")
    quant.select_by_value("")
    wait(driver, lambda d: len(_table_names(d)) == len(api), what="all models again")


def test_a_models_metadata_is_shown(driver, ui_server, shots):
    srv = ui_server
    _open_models(driver, srv.url)
    name = "delta-qwen2.gguf"
    click(driver, f'tr[data-name="{name}"] button[data-action="details"]')
    dialog = wait(driver, lambda d: [e for e in css(d, "#model-details") if e.is_displayed()],
                   what="the details dialog")[0]  # fmt: skip
    f = read_gguf(Path(srv.state.pool.models_dir) / name)
    n_params = sum(t.n_elements for t in f.tensors.values())
    assert css(driver, "#model-details-title")[0].text == name
    assert css(driver, "dd.fact-architecture")[0].text == "qwen2"
    assert f"({n_params:,})" in css(driver, "dd.fact-parameters")[0].text
    assert css(driver, "dd.fact-context")[0].text == str(f.metadata["qwen2.context_length"])
    types = {r.get_attribute("data-type"): r.text for r in css(driver, ".quant-types tbody tr")}
    assert set(types) == {"Q4_0", "Q8_0", "F32"}  # the token embedding keeps Q8_0
    q4 = sum(t.n_elements for t in f.tensors.values() if t.ggml_type == 2)
    assert f"{q4 / n_params * 100:.1f} %" in types["Q4_0"]
    template = css(driver, "pre.chat-template")[0]
    shown = driver.execute_script("return arguments[0].textContent", template)
    assert shown == f.metadata["tokenizer.chat_template"]
    driver.save_screenshot(str(shots / "model-details.png"))
    click(driver, "#model-details-close")
    wait(driver, lambda d: not dialog.is_displayed(), what="closed")


def test_a_download_that_never_connects_says_so(driver, ui_server):
    srv = ui_server
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _open_models(driver, srv.url)
    css(driver, "#dl-url")[0].send_keys(f"http://127.0.0.1:{port}/nowhere.gguf")
    click(driver, "#dl-start")
    row = wait(driver, lambda d: css(d, '#downloads-table tr[data-state="failed"]'), what="failed")[
        0
    ]
    assert "could not connect to 127.0.0.1" in row.text and "interrupted" not in row.text
    assert not row.find_elements("css selector", 'button[data-action="dl-resume"]')

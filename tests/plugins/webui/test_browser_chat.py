"""The chat page against the real bundled model in headless Chromium: the streamed answer
is the model's greedy answer, the conversation survives a reload, and Stop ends the
stream in the page and frees the server's slot."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import call
from webui_browser import (
    THINKING_TEMPLATE,
    click,
    css,
    fresh_page,
    last_answer,
    send,
    stored_conversations,
    type_into,
    wait,
)

from tessera.engine.slots import SlotEngine
from tessera.plugins.server.testing import live_server

SYSTEM = "You answer about Python."


@pytest.fixture(scope="module")
def chat_server():
    argv = [
        "--backend",
        "numpy",
        "-c",
        "512",
        "-np",
        "2",
        "--chat-template",
        str(THINKING_TEMPLATE),
    ]
    with live_server(argv) as srv:
        yield srv


def _settings(driver, **values) -> None:
    if not css(driver, "#chat-settings")[0].is_displayed():
        click(driver, "#settings-toggle")
    if "system" in values:
        type_into(driver, "#set-system", values.pop("system"))
    for name, value in values.items():
        type_into(driver, f"#set-{name}", str(value))


def test_the_answer_is_the_models_and_the_conversation_survives_a_reload(driver, chat_server):
    srv = chat_server
    fresh_page(driver, srv.url)
    _settings(driver, system=SYSTEM, temperature=0, max_tokens=24)
    prompt = "Tell me about the for statement."
    send(driver, prompt)
    answer = last_answer(driver)
    assert int(answer.get_attribute("data-chunks")) > 1  # it arrived in pieces
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 24,
    }
    expected = call(srv.v1 + "/chat/completions", body)[1]

    def saved(d):
        return [c for c in stored_conversations(d) if c["messages"][-1].get("state") == "done"]

    (stored,) = wait(driver, saved, what="the answer saved")
    assert stored["messages"][-1]["content"] == expected["choices"][0]["message"]["content"]
    assert (
        stored["messages"][-1]["usage"]["completion_tokens"]
        == expected["usage"]["completion_tokens"]
    )
    assert stored["title"] == prompt and stored["settings"]["system"] == SYSTEM
    rendered = answer.get_attribute("innerHTML")
    assert len(answer.find_element("css selector", ".content").text) > 10

    driver.refresh()
    restored = last_answer(driver)
    assert restored.get_attribute("innerHTML") == rendered
    assert css(driver, ".msg.user .content")[0].text == prompt
    titles = [e.text for e in css(driver, "#conversation-list .conv-title")]
    assert titles == [prompt]
    assert css(driver, "#conversation-list li.conv.active")
    assert css(driver, "#set-system")[0].get_attribute("value") == SYSTEM
    assert css(driver, "#set-max_tokens")[0].get_attribute("value") == "24"


def test_stop_ends_the_stream_and_frees_the_slot(driver, chat_server, monkeypatch):
    srv = chat_server
    fresh_page(driver, srv.url)
    _settings(driver, max_tokens=200)
    # the engine is paced until the page shows a piece, then held at its next token, so
    # the click lands mid-answer however fast the model is (the first tokens may show
    # nothing: a "<think>" tag the reasoning parser keeps, a partial UTF-8 character)
    piece_shown, gate = threading.Event(), threading.Event()
    emit_token = SlotEngine.emit_token

    def emit_paced_then_hold(engine, slot, event):
        emit_token(engine, slot, event)
        if piece_shown.is_set():
            gate.wait(60)
        else:
            time.sleep(0.1)

    monkeypatch.setattr(SlotEngine, "emit_token", emit_paced_then_hold)
    engine = srv.model.engine
    predicted_before = engine.metrics.n_tokens_predicted
    send(driver, "Go on.")
    try:
        wait(driver, lambda d: int(css(d, ".msg.assistant")[-1].get_attribute("data-chunks")) > 0,
             timeout=60, what="the first piece")  # fmt: skip
        piece_shown.set()
        assert css(driver, "#chat-send")[0].is_displayed() is False
        click(driver, "#chat-stop")
        stopped = last_answer(driver, "stopped")
    finally:
        gate.set()
    chunks, text = stopped.get_attribute("data-chunks"), stopped.text
    # the server saw the client go away and freed the slot long before 200 tokens
    wait(driver, lambda d: all(s.task is None for s in engine.slots), what="the slot freed")
    assert engine.metrics.n_tokens_predicted - predicted_before < 200
    time.sleep(0.5)  # nothing more arrives in the page after Stop
    assert (stopped.get_attribute("data-chunks"), stopped.text) == (chunks, text)
    assert int(chunks) < 200 and "stopped" in stopped.find_element("css selector", ".meta").text
    assert css(driver, "#chat-send")[0].is_displayed()
    assert not css(driver, "#chat-stop")[0].is_displayed()
    (stored,) = stored_conversations(driver)
    assert stored["messages"][-1]["state"] == "stopped"

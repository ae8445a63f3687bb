"""Conversations in headless Chromium, the model's answer scripted and every request the
page sends recorded: settings (system prompt, samplers) belong to their conversation and
reach the server; rename, delete, export and import; regenerate and edit-and-resend;
text files attached to a message."""

from __future__ import annotations

import json

import pytest
from webui_browser import (
    click,
    css,
    fresh_page,
    last_answer,
    prompt_text,
    scripted_answer,
    send,
    stored_conversations,
    type_into,
    wait,
)

from tessera.plugins.server.testing import live_server

ANSWER = "Noted."


@pytest.fixture(scope="module")
def conv_server():
    with live_server(["--backend", "numpy", "-c", "512", "-np", "1"]) as srv:
        yield srv


def _open_settings(driver) -> None:
    if not css(driver, "#chat-settings")[0].is_displayed():
        click(driver, "#settings-toggle")


def _values(driver) -> dict[str, str]:
    names = (
        "system",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repeat_penalty",
        "repeat_last_n",
        "max_tokens",
        "seed",
    )
    return {n: css(driver, f"#set-{n}")[0].get_attribute("value") for n in names}


def _open_conversation(driver, title: str) -> None:
    click(driver, f'#conversation-list li.conv button.conv-title[title="{title}"]')
    wait(driver, lambda d: css(d, ".msg.user") and css(d, ".msg.user .content")[0].text == title,
         what=f"conversation {title!r}")  # fmt: skip


def test_settings_belong_to_their_conversation_and_reach_the_server(driver, conv_server):
    srv = conv_server
    fresh_page(driver, srv.url)
    _open_settings(driver)
    first = {"system": "You are terse.", "temperature": "0.3", "top_k": "7", "min_p": "0.1",
             "max_tokens": "5", "seed": "42"}  # fmt: skip
    for name, value in first.items():
        type_into(driver, f"#set-{name}", value)
    with scripted_answer(srv, ANSWER) as engine:
        send(driver, "Alpha")
        last_answer(driver)
        click(driver, "#chat-new")
        wait(driver, lambda d: css(d, "#chat-log .empty-chat"), what="a new chat")
        assert _values(driver)["temperature"] == "0.3"  # a new chat starts from the last one's
        second = {"system": "", "temperature": "1.2", "top_p": "0.5", "repeat_penalty": "1.3",
                  "repeat_last_n": "-1", "top_k": "", "seed": ""}  # fmt: skip
        for name, value in second.items():
            type_into(driver, f"#set-{name}", value)
        send(driver, "Beta")
        last_answer(driver)
    a, b = engine.requests
    assert (a.sampler.temperature, a.sampler.top_k, a.sampler.min_p, a.sampler.seed) == (
        0.3,
        7,
        0.1,
        42,
    )
    assert a.max_tokens == 5 and "You are terse." in prompt_text(srv, a)
    assert (b.sampler.temperature, b.sampler.top_p, b.sampler.repeat_penalty) == (1.2, 0.5, 1.3)
    assert (a.sampler.repeat_last_n, b.sampler.repeat_last_n) == (64, -1)  # default, then given
    assert b.sampler.top_k == 40 and "You are terse." not in prompt_text(srv, b)  # defaults
    expected_a = {**dict.fromkeys(_values(driver), ""), **first}
    expected_b = {**expected_a, **second}
    _open_conversation(driver, "Alpha")
    assert _values(driver) == expected_a
    driver.refresh()
    wait(driver, lambda d: css(d, ".msg.user"), what="the conversation after a reload")
    _open_settings(driver)
    assert _values(driver) == expected_a
    _open_conversation(driver, "Beta")
    assert _values(driver) == expected_b
    stored = {c["title"]: c["settings"] for c in stored_conversations(driver)}
    assert stored["Alpha"]["top_k"] == "7" and "top_k" not in stored["Beta"]


#: name -> (what is typed, what the server's sampler must hold)
MORE_SAMPLERS = {
    "presence_penalty": ("0.5", 0.5),
    "frequency_penalty": ("-0.25", -0.25),
    "typical_p": ("0.9", 0.9),
    "top_n_sigma": ("1.5", 1.5),
    "xtc_probability": ("0.3", 0.3),
    "xtc_threshold": ("0.2", 0.2),
    "dry_multiplier": ("0.8", 0.8),
    "dry_base": ("2", 2.0),
    "dry_allowed_length": ("3", 3),
    "dry_penalty_last_n": ("-1", -1),
}


def test_the_later_samplers_are_folded_away_and_reach_the_server(driver, conv_server):
    srv = conv_server
    fresh_page(driver, srv.url)
    _open_settings(driver)
    more = css(driver, "#settings-more")[0]
    assert more.get_attribute("open") is None  # folded: a new chat sets none of them
    assert not css(driver, "#set-dry_multiplier")[0].is_displayed()
    click(driver, "#settings-more summary")
    for name, (typed, _) in MORE_SAMPLERS.items():
        type_into(driver, f"#set-{name}", typed)
    with scripted_answer(srv, ANSWER) as engine:
        send(driver, "Gamma")
        last_answer(driver)
    (request,) = engine.requests
    assert {n: getattr(request.sampler, n) for n in MORE_SAMPLERS} == {
        n: value for n, (_, value) in MORE_SAMPLERS.items()
    }
    driver.refresh()
    wait(driver, lambda d: css(d, ".msg.user"), what="the conversation after a reload")
    _open_settings(driver)
    assert css(driver, "#settings-more")[0].get_attribute("open") == "true"  # it sets some
    for name, (typed, _) in MORE_SAMPLERS.items():
        assert css(driver, f"#set-{name}")[0].get_attribute("value") == typed, name


def test_the_greyed_hints_are_the_servers_defaults(driver):
    flags = ["--temp", "0.3", "--top-k", "7", "--dry-multiplier", "0.5", "-n", "20"]
    with live_server(["--backend", "numpy", "-c", "256", "-np", "1", *flags]) as srv:
        fresh_page(driver, srv.url)
        _open_settings(driver)
        expected = {"temperature": "0.3", "top_k": "7", "dry_multiplier": "0.5",
                    "max_tokens": "20", "top_p": "0.95", "seed": "random"}  # fmt: skip
        hints = lambda d: {n: css(d, f"#set-{n}")[0].get_attribute("placeholder")  # noqa: E731
                           for n in expected}  # fmt: skip
        wait(driver, lambda d: hints(d) == expected, what=f"the server's defaults {expected}")
        assert _values(driver) == dict.fromkeys(_values(driver), "")  # hints, not values


def test_rename_delete_export_and_import(driver, conv_server, downloads_dir):
    srv = conv_server
    fresh_page(driver, srv.url)
    with scripted_answer(srv, ANSWER):
        for text in ("One", "Two"):
            click(driver, "#chat-new")
            send(driver, text)
            last_answer(driver)
    titles = lambda d: [e.text for e in css(d, "#conversation-list .conv-title")]  # noqa: E731
    assert titles(driver) == ["Two", "One"]  # the most recent first
    click(driver, '#conversation-list li.conv:last-child button[data-action="rename"]')
    box = css(driver, "#conversation-list input.conv-rename")[0]
    assert box.get_attribute("value") == "One"
    box.send_keys("First chat\n")  # the old name is selected: typing replaces it
    wait(driver, lambda d: "First chat" in titles(d), what="renamed")
    driver.refresh()
    wait(driver, lambda d: sorted(titles(d)) == ["First chat", "Two"], what="names after reload")

    for old in downloads_dir.glob("*.json"):
        old.unlink()
    click(driver, "#conv-export")
    exported = wait(driver, lambda d: list(downloads_dir.glob("tessera-conversations-*.json")),
                    what="the exported file")[0]  # fmt: skip
    data = wait(driver, lambda d: _json_or_none(exported), what="the whole file")
    assert data["format"] == "tessera-conversations"
    assert sorted(c["title"] for c in data["conversations"]) == ["First chat", "Two"]

    for left in (1, 0):
        click(driver, '#conversation-list li.conv button[data-action="delete"]')
        driver.switch_to.alert.accept()
        wait(driver, lambda d, left=left: len(css(d, "#conversation-list li.conv")) == left,
             what="deleted")  # fmt: skip
    assert stored_conversations(driver) == []
    css(driver, "#conv-import-file")[0].send_keys(str(exported))
    wait(driver, lambda d: sorted(titles(d)) == ["First chat", "Two"], what="imported")
    back = {c["title"]: c["messages"] for c in stored_conversations(driver)}
    assert back == {c["title"]: c["messages"] for c in data["conversations"]}
    assert "imported 2 conversations" in css(driver, "#status")[0].text
    bad = {"notes.json": "not JSON at all", "other.json": '{"messages": [{"role": 1}]}'}
    for name, text in bad.items():
        (downloads_dir / name).write_text(text, encoding="utf-8")
    for name, says in [("notes.json", "notes.json is not JSON"),
                       ("other.json", "other.json holds no conversations")]:  # fmt: skip
        css(driver, "#conv-import-file")[0].send_keys(str(downloads_dir / name))
        wait(driver, lambda d, says=says: says in css(d, "#status")[0].text, what=says)
        assert "import a file exported from this page" in css(driver, "#status")[0].text
    assert len(stored_conversations(driver)) == 2  # nothing came in, nothing was lost


def _json_or_none(path):
    try:
        return json.loads(path.read_text())
    except ValueError:  # still being written
        return None


def test_regenerate_and_edit_resend(driver, conv_server):
    srv = conv_server
    fresh_page(driver, srv.url)
    with scripted_answer(srv, ANSWER) as engine:
        send(driver, "Original question")
        last_answer(driver)
        click(driver, '.msg.assistant button[data-action="regenerate"]')
        wait(driver, lambda d: len(engine.requests) == 2, what="the regenerated request")
        last_answer(driver)
        assert len(css(driver, ".msg")) == 2  # the answer replaced, not added
        assert engine.requests[0].prompt == engine.requests[1].prompt
        click(driver, '.msg.user button[data-action="edit"]')
        box = css(driver, ".msg.user textarea.edit-box")[0]
        box.clear()
        box.send_keys("Edited question")
        click(driver, '.msg.user button[data-action="edit-send"]')
        wait(driver, lambda d: len(engine.requests) == 3, what="the edited request")
        last_answer(driver)
    edited = prompt_text(srv, engine.requests[2])
    assert "Edited question" in edited and "Original question" not in edited
    assert [e.text for e in css(driver, ".msg.user .content")] == ["Edited question"]
    (stored,) = stored_conversations(driver)
    assert [m["content"] for m in stored["messages"]] == ["Edited question", ANSWER]


def test_an_attached_text_file_goes_into_the_message(driver, conv_server, tmp_path):
    srv = conv_server
    fresh_page(driver, srv.url)
    notes = tmp_path / "notes.txt"
    notes.write_text("The meeting moved to Thursday at 10.\n")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02\xff")
    css(driver, "#chat-attach")[0].send_keys(str(binary))
    wait(driver, lambda d: "not a UTF-8 text file" in css(d, "#status")[0].text, what="refused")
    css(driver, "#chat-attach")[0].send_keys(str(notes))
    wait(driver, lambda d: "notes.txt" in css(d, "#chat-attachments")[0].text, what="the chip")
    with scripted_answer(srv, ANSWER) as engine:
        send(driver, "Summarise the file.")
        last_answer(driver)
    prompt = prompt_text(srv, engine.requests[0])
    assert "Summarise the file." in prompt and "The meeting moved to Thursday at 10." in prompt
    assert "notes.txt" in css(driver, ".msg.user .attachments")[0].text
    assert not css(driver, "#chat-attachments")[0].is_displayed()  # handed to the message
    (stored,) = stored_conversations(driver)
    assert stored["messages"][0]["attachments"][0]["name"] == "notes.txt"

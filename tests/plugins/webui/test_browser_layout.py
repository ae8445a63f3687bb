"""The page's frame in headless Chromium: it fills the window, works at a phone's width
(375 and 390 px: no horizontal scroll, the conversations slide in), follows the system's light or
dark scheme until switched and remembers the switch, and every file it loads is there
(the favicon too). Also makes the chat screenshots of docs/web-ui.md."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from webui_browser import (
    THINKING_TEMPLATE,
    click,
    css,
    fresh_page,
    last_answer,
    no_horizontal_scroll,
    scripted_answer,
    send,
    wait,
)

from tessera.plugins.server.testing import live_server

SHOWCASE = """<think>A list in Python is written with square brackets; show one, say how \
fast indexing is, and keep it short.</think>A **list** holds items in order:

```python
primes = [2, 3, 5, 7]
primes.append(11)  # lists grow at the end in O(1) amortised time
print(primes[-1])  # 11, and this comment is long enough to need a horizontal scrollbar on a phone
```

| operation | cost |
|---|---|
| `xs[i]` | $O(1)$ |
| `x in xs` | $O(n)$ |

See https://docs.python.org/3/tutorial/datastructures.html#more-on-lists for more.
"""

LIGHT_BG, DARK_BG = "rgb(246, 247, 249)", "rgb(20, 24, 29)"


@pytest.fixture(scope="module")
def layout_server():
    argv = [
        "--backend",
        "numpy",
        "-c",
        "512",
        "-np",
        "1",
        "--chat-template",
        str(THINKING_TEMPLATE),
    ]
    with live_server(argv) as srv:
        yield srv


#: The docs' phone screenshots are taken at the narrower width.
SHOT_WIDTH = 375


@pytest.fixture(params=[375, 390], ids=lambda w: f"{w}px")
def phone(driver, request):
    """The browser at a phone's width, and that width."""
    driver.set_window_size(request.param, 812)
    yield driver, request.param
    driver.set_window_size(1200, 820)


def _scheme(driver, value: str) -> None:
    features = [{"name": "prefers-color-scheme", "value": value}]
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": features})


def _background(driver) -> str:
    return driver.execute_script("return getComputedStyle(document.body).backgroundColor")


def _code_sheet(driver) -> str:
    """Which highlight.js theme applies now: light or dark."""
    return driver.execute_script(
        "const on = (id) => matchMedia(document.getElementById(id).media).matches;"
        "return on('hljs-dark') && !on('hljs-light') ? 'dark' :"
        " on('hljs-light') && !on('hljs-dark') ? 'light' : 'both or none';"
    )


def _new_chat(driver) -> None:
    if not css(driver, "#chat-new")[0].is_displayed():  # at a phone's width: slide it in
        click(driver, "#sidebar-toggle")
    click(driver, "#chat-new")


def _showcase(driver, srv) -> None:
    """Three conversations, the last one answered with reasoning, markdown, code, a table."""
    fresh_page(driver, srv.url)
    with scripted_answer(srv, "Here you are."):
        for text in ("Write a haiku about tensors", "What does a KV cache hold?"):
            _new_chat(driver)
            send(driver, text)
            last_answer(driver)
    _new_chat(driver)
    with scripted_answer(srv, SHOWCASE):
        send(driver, "How do lists work in Python?")
        last_answer(driver)


def test_the_page_fills_the_window_and_screenshots(driver, layout_server, shots):
    _scheme(driver, "light")
    _showcase(driver, layout_server)
    height = driver.execute_script("return window.innerHeight")
    form = css(driver, "#chat-form")[0].rect
    assert height - 40 < form["y"] + form["height"] <= height + 1  # the composer at the bottom
    assert driver.execute_script("return document.documentElement.scrollHeight") <= height
    assert no_horizontal_scroll(driver)
    click(driver, ".msg.assistant .thinking summary")  # the reasoning, unfolded
    driver.save_screenshot(str(shots / "chat.png"))
    _scheme(driver, "dark")
    wait(driver, lambda d: _background(d) == DARK_BG, what="dark colours")
    click(driver, "#settings-toggle")
    css(driver, "#set-system")[0].send_keys("Answer briefly, with an example.")
    assert driver.execute_script("return document.documentElement.scrollHeight") <= height
    driver.save_screenshot(str(shots / "chat-dark.png"))


def test_phone_width_has_no_horizontal_scroll(phone, layout_server, shots):
    driver, width = phone
    _scheme(driver, "light")
    assert driver.execute_script("return window.innerWidth") == width

    def shot(name: str) -> None:
        if width == SHOT_WIDTH:
            driver.save_screenshot(str(shots / name))

    _showcase(driver, layout_server)
    assert no_horizontal_scroll(driver)
    sidebar = css(driver, "#sidebar")[0]
    assert sidebar.rect["x"] + sidebar.rect["width"] <= 0  # off to the side
    shot("chat-phone.png")
    click(driver, "#sidebar-toggle")
    wait(driver, lambda d: sidebar.rect["x"] >= 0, what="the conversations slid in")
    assert no_horizontal_scroll(driver)
    shot("chat-phone-conversations.png")
    click(driver, '#conversation-list button.conv-title[title="Write a haiku about tensors"]')
    wait(driver, lambda d: sidebar.rect["x"] + sidebar.rect["width"] <= 0, what="slid out")
    click(driver, "#settings-toggle")
    assert no_horizontal_scroll(driver)
    driver.get(layout_server.url + "/#models")
    wait(driver, lambda d: css(d, "#models-table tbody tr"), what="the models table")
    assert no_horizontal_scroll(driver)


def test_theme_follows_the_system_until_switched_and_is_remembered(driver, layout_server):
    fresh_page(driver, layout_server.url)
    _scheme(driver, "dark")
    toggle = "#theme-toggle"
    wait(driver, lambda d: _background(d) == DARK_BG, what="dark, as the system prefers")
    assert css(driver, toggle)[0].get_attribute("data-choice") == "auto"
    assert _code_sheet(driver) == "dark"
    click(driver, toggle)  # auto -> light
    wait(driver, lambda d: _background(d) == LIGHT_BG, what="light")
    assert _code_sheet(driver) == "light"
    driver.refresh()
    wait(driver, lambda d: css(d, toggle)[0].get_attribute("data-choice") == "light", what="kept")
    assert _background(driver) == LIGHT_BG and _code_sheet(driver) == "light"
    click(driver, toggle)  # light -> dark, whatever the system says
    _scheme(driver, "light")
    wait(driver, lambda d: _background(d) == DARK_BG, what="dark")
    assert _code_sheet(driver) == "dark"
    click(driver, toggle)  # dark -> auto: the system's light again
    wait(driver, lambda d: _background(d) == LIGHT_BG, what="auto")
    assert driver.execute_script("return localStorage.getItem('tessera.theme')") is None


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_every_file_the_page_loads_is_there_and_the_favicon_too(driver, layout_server):
    url = layout_server.url
    fresh_page(driver, url)
    loaded = driver.execute_script(
        "return performance.getEntriesByType('resource').map(e => [e.name, e.responseStatus])"
    )
    assert len(loaded) >= 10 and all(status == 200 for _, status in loaded), loaded
    status, kind, body = _get(url + "/favicon.ico")
    assert (status, kind) == (200, "image/svg+xml") and body.startswith(b"<svg")
    icon = driver.execute_script("return document.querySelector('link[rel=icon]').href")
    assert _get(icon)[0] == 200
    for outside in ("/ui/..%2Fapi.py", "/ui/vendor/update.sh", "/ui/nothing.js"):
        assert _get(url + outside)[0] == 404, outside

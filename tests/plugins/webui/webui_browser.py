"""Helpers of the web UI's browser tests: waiting on the page, reading what the page
stored in IndexedDB, and a scripted slot engine that answers with a fixed text.

The scripted engine stands in for the slot engine of a live server (as the server's
tool-call tests do): the model's answer is known, so what the page makes of it
(markdown, reasoning, sanitizing, token counts) can be compared exactly, and every
request the page sent is recorded with its sampler settings and prompt.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from tessera.plugins.server.testing import scripted_answer as served_answer

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat-templates"
#: Qwen3's template names <think>...</think>, so the chat plugin splits reasoning out.
THINKING_TEMPLATE = TEMPLATES / "Qwen-Qwen3-0.6B.jinja"
#: Milliseconds the scripted engine reports per generated token (timings: 50 tokens/s).
MS_PER_TOKEN = 20.0


def wait(driver, predicate, timeout: float = 30.0, what: str = ""):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d):
        try:
            return predicate(d)
        except StaleElementReferenceException:  # the element was re-rendered meanwhile
            return False

    return WebDriverWait(driver, timeout, 0.05).until(safe, what)


def css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def click(driver, selector: str) -> None:
    def clicked(d):
        found = [e for e in css(d, selector) if e.is_displayed()]
        return bool(found) and (found[0].click() or True)

    wait(driver, clicked, what=f"click {selector}")


def type_into(driver, selector: str, text: str) -> None:
    box = css(driver, selector)[0]
    box.clear()
    if text:
        box.send_keys(text)


def stored_conversations(driver) -> list[dict]:
    """Every conversation the page keeps in IndexedDB, as stored."""
    return driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const req = indexedDB.open("tessera-webui");
        req.onsuccess = () => {
          const get = req.result.transaction("conversations").objectStore("conversations").getAll();
          get.onsuccess = () => { req.result.close(); done(get.result); };
        };
        req.onerror = () => done(null);
        """
    )


def fresh_page(driver, url: str) -> None:
    """Open the chat page with nothing stored: no conversations, no remembered choices."""
    driver.get(url + "/#chat")
    wait(driver, lambda d: css(d, "#chat-log .empty-chat, #chat-log .msg"), what="the chat page")
    driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        localStorage.clear();
        const req = indexedDB.open("tessera-webui");
        req.onsuccess = () => {
          const tx = req.result.transaction("conversations", "readwrite");
          tx.objectStore("conversations").clear();
          tx.oncomplete = () => { req.result.close(); done(true); };
        };
        """
    )
    driver.refresh()
    wait(driver, lambda d: css(d, "#chat-log .empty-chat"), what="an empty chat")
    wait(driver, lambda d: d.execute_script("return document.getElementById('chat-model').value"),
         what="the model picker")  # fmt: skip


def send(driver, text: str) -> None:
    css(driver, "#chat-input")[0].send_keys(text)
    click(driver, "#chat-send")


def last_answer(driver, state: str = "done", timeout: float = 60.0):
    """The last answer once it reaches ``state``."""

    def reached(d):
        answers = css(d, ".msg.assistant")
        return answers and answers[-1].get_attribute("data-state") == state and answers[-1]

    return wait(driver, reached, timeout, f"the answer to be {state}")


def no_horizontal_scroll(driver) -> bool:
    return driver.execute_script(
        "const w = window.innerWidth;"
        "return document.documentElement.scrollWidth <= w && document.body.scrollWidth <= w;"
    )


@contextlib.contextmanager
def scripted_answer(srv, text: str):
    """The server's model answers ``text`` to everything inside the block, a token every
    4 ms, reporting ``MS_PER_TOKEN``; yields the scripted engine (its ``requests``, and
    ``tokens``: the answer's)."""
    with served_answer(srv, text, delay_s=0.004, t_prompt_ms=5.0, ms_per_token=MS_PER_TOKEN) as e:
        yield e


def prompt_text(srv, request) -> str:
    return srv.model.tokenizer.decode(list(request.prompt))

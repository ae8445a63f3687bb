"""How the chat page shows an answer, in headless Chromium, with the model's answer
scripted: markdown becomes HTML (code highlighted, lists, math, no raw markup), HTML in
the answer is sanitized (nothing runs), reasoning streams into its own block, and the
token counts and speed are the server's."""

from __future__ import annotations

import pytest
from webui_browser import (
    MS_PER_TOKEN,
    THINKING_TEMPLATE,
    css,
    fresh_page,
    last_answer,
    scripted_answer,
    send,
    wait,
)

from tessera.plugins.server.testing import live_server

MARKDOWN = """Here is **bold** text and `inline code`.

- first item
- second item

```python
def double(x):
    return x * 2
```

Euler: $e^{i\\pi} + 1 = 0$ and it costs $5 and $10.
"""

HOSTILE = """Look: <script>window.__pwned = "script"</script>
<img src="x" onerror="window.__pwned = 'img'">
[a link](javascript:window.__pwned='link') and
<a href="https://example.org/" onclick="window.__pwned='a'">ok</a>
<iframe src="javascript:window.__pwned='iframe'"></iframe>
"""

REASONING = "The user wants a count. Four words, so 4."
THINKING = f"<think>{REASONING}</think>The answer is **4**."


@pytest.fixture(scope="module")
def answer_server():
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


def test_markdown_becomes_highlighted_html(driver, answer_server):
    fresh_page(driver, answer_server.url)
    with scripted_answer(answer_server, MARKDOWN):
        send(driver, "Show me some markdown.")
        answer = last_answer(driver)
    content = answer.find_element("css selector", ".content")
    assert content.find_element("css selector", "strong").text == "bold"
    assert content.find_element("css selector", "p code").text == "inline code"
    assert [li.text for li in content.find_elements("css selector", "ul > li")] == [
        "first item",
        "second item",
    ]
    code = content.find_element("css selector", "pre code.hljs.language-python")
    assert "def double(x):" in code.text
    keywords = [k.text for k in code.find_elements("css selector", ".hljs-keyword")]
    assert "def" in keywords and "return" in keywords  # highlighted, not plain text
    assert content.find_elements("css selector", "math")  # $...$ typeset as MathML
    assert "$5 and $10" in content.text  # prices are not math
    assert "**" not in content.text and "```" not in content.text and "- first" not in content.text
    # Copy gives the answer's markdown, not its HTML
    perms = ["clipboardReadWrite", "clipboardSanitizedWrite"]
    driver.execute_cdp_cmd("Browser.grantPermissions", {"permissions": perms})
    answer.find_element("css selector", 'button[data-action="copy"]').click()
    wait(driver, lambda d: answer.find_element("css selector", 'button[data-action="copy"]').text
         == "Copied", what="copied")  # fmt: skip
    copied = driver.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0]('error ' + e))"
    )
    assert copied == MARKDOWN


def test_html_in_an_answer_is_sanitized(driver, answer_server):
    fresh_page(driver, answer_server.url)
    with scripted_answer(answer_server, HOSTILE):
        send(driver, "Say something hostile.")
        answer = last_answer(driver)
    content = answer.find_element("css selector", ".content")
    assert "Look:" in content.text
    assert driver.execute_script("return window.__pwned") is None  # nothing ran
    assert not content.find_elements("css selector", "script, iframe")
    for img in content.find_elements("css selector", "img"):
        assert img.get_attribute("onerror") is None
    hrefs = [a.get_attribute("href") or "" for a in content.find_elements("css selector", "a")]
    assert "https://example.org/" in hrefs
    assert not [h for h in hrefs if h.startswith("javascript:")]
    assert all(
        a.get_attribute("onclick") is None for a in content.find_elements("css selector", "a")
    )
    # and after a reload the stored answer is sanitized again on its way in
    driver.refresh()
    last_answer(driver)
    assert driver.execute_script("return window.__pwned") is None


def test_reasoning_streams_into_its_block_and_the_speed_is_shown(driver, answer_server):
    fresh_page(driver, answer_server.url)
    with scripted_answer(answer_server, THINKING) as engine:
        engine.delay_s = 0.05  # slow enough to see the reasoning arrive first
        send(driver, "How many words are in 'one two three four'?")
        thinking = wait(driver, lambda d: css(d, ".msg.assistant .thinking"), what="thinking")[0]
        assert thinking.get_attribute("open") == "true"  # open while it thinks
        answer = last_answer(driver)
    body = thinking.find_element("css selector", ".thinking-body")
    assert driver.execute_script("return arguments[0].textContent", body).strip() == REASONING
    content = answer.find_element("css selector", ".content")
    assert content.text == "The answer is 4." and content.find_element("css selector", "strong")
    assert "think" not in content.get_attribute("innerHTML")
    assert thinking.get_attribute("open") is None  # folded once the answer is there
    meta = answer.find_element("css selector", ".meta")
    n = len(engine.tokens)
    assert meta.get_attribute("data-completion-tokens") == str(n)
    assert float(meta.get_attribute("data-tokens-per-second")) == pytest.approx(1000 / MS_PER_TOKEN)
    assert f"{n} tokens" in meta.text and "50.0 tok/s" in meta.text
    thinking.find_element("css selector", "summary").click()
    assert thinking.get_attribute("open") == "true"


def test_an_answers_markup_does_not_depend_on_the_order_its_parts_arrived(driver, answer_server):
    """A stream that brings the speed (timings) before the token count (usage) renders the
    same markup as the stored answer does after a reload, which fills both at once."""
    fresh_page(driver, answer_server.url)
    streamed, restored = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        import("/ui/message-view.js").then(({ messageElement, updateAssistant }) => {
          const final = { role: "assistant", content: "hi", state: "done", model: "m",
                          usage: { completion_tokens: 3, prompt_tokens: 2 },
                          timings: { predicted_per_second: 12.5 } };
          const live = messageElement({ role: "assistant", content: "", state: "streaming" }, 1);
          updateAssistant(live, { ...final, state: "streaming", usage: undefined });
          updateAssistant(live, final);
          done([live.innerHTML, messageElement(final, 1).innerHTML]);
        }, (e) => done([String(e), ""]));
        """
    )
    assert "data-tokens-per-second" in streamed
    assert streamed == restored

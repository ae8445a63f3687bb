"""The start lines of ``tessera serve``: the web UI's address is announced when the web UI
plugin serves its page, and not when the plugin is disabled."""

from __future__ import annotations

from tessera.plugin_manager import Runtime
from tessera.plugins.server.start_line import serves_a_page, start_lines

ADDRESSES = ["http://127.0.0.1:8080", "http://[::1]:8080", "unix:/tmp/t.sock"]


def test_with_the_web_ui_plugin_its_url_is_announced():
    routes = Runtime().routes()
    assert serves_a_page(routes)
    assert start_lines(ADDRESSES, "m.gguf", routes) == [
        "tessera serve: http://127.0.0.1:8080, http://[::1]:8080, unix:/tmp/t.sock (m.gguf)",
        "tessera serve: web UI at http://127.0.0.1:8080/, http://[::1]:8080/",
    ]


def test_without_the_web_ui_plugin_no_url_is_announced():
    routes = Runtime(disabled=["webui"]).routes()
    assert "POST /v1/chat/completions" in routes  # the server itself is there
    assert not serves_a_page(routes)
    assert start_lines(ADDRESSES[:1], "m.gguf", routes) == [
        "tessera serve: http://127.0.0.1:8080 (m.gguf)"
    ]


def test_a_unix_socket_alone_gets_no_web_ui_line():
    assert start_lines(["unix:/tmp/t.sock"], "m", Runtime().routes()) == [
        "tessera serve: unix:/tmp/t.sock (m)"
    ]

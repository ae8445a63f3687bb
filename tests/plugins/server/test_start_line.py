"""The start lines of ``tessera serve``: the web UI's address is announced when the web UI
plugin serves its page, and not when the plugin is disabled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

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


def test_a_wildcard_address_is_announced_at_the_loopback_one():
    lines = start_lines(["http://0.0.0.0:9931", "http://[::]:9931"], "m", Runtime().routes())
    assert lines[1] == "tessera serve: web UI at http://127.0.0.1:9931/, http://[::1]:9931/"
    lines = start_lines(["http://0.0.0.0:9931", "http://127.0.0.1:9931"], "m", Runtime().routes())
    assert lines[1] == "tessera serve: web UI at http://127.0.0.1:9931/"  # once


def test_a_unix_socket_alone_gets_no_web_ui_line():
    assert start_lines(["unix:/tmp/t.sock"], "m", Runtime().routes()) == [
        "tessera serve: unix:/tmp/t.sock (m)"
    ]


def _serve_and_read(env: dict[str, str]) -> tuple[list[str], str]:
    """The ``tessera serve:`` lines a real ``tessera serve --port 0`` prints (every one is
    printed before the server answers), and the first bytes its ``/`` answers with."""
    argv = [sys.executable, "-m", "tessera", "serve", "--backend", "numpy", "-c", "128"]
    proc = subprocess.Popen(
        [*argv, "--port", "0"], stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )
    try:
        first = proc.stderr.readline()
        while first and not first.startswith("tessera serve:"):
            first = proc.stderr.readline()
        base = re.match(r"tessera serve: (http://[^ ]+) ", first)
        assert base, f"no start line; stderr ended with {first!r}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(base.group(1) + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        try:
            with urllib.request.urlopen(base.group(1) + "/", timeout=10) as r:
                page = r.read(200).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            page = f"HTTP {exc.code}"
    finally:
        proc.terminate()
        proc.wait(30)
        # the same text stream readline used: its buffer may hold lines read ahead
        rest = proc.stderr.read()
    lines = [first.rstrip("\n")] + [x for x in rest.splitlines() if x.startswith("tessera serve:")]
    return lines, page


@pytest.mark.parametrize("disabled", [False, True])
def test_tessera_serve_prints_the_url_of_the_page_it_serves(disabled):
    env = {"TESSERA_DISABLE_PLUGINS": "webui"} if disabled else {}
    lines, page = _serve_and_read(env)
    where = re.match(r"tessera serve: (http://[^ ]+) \(tessera-default.gguf\)$", lines[0])
    assert where, lines
    if disabled:
        assert lines == [lines[0]] and page == "HTTP 404"
    else:
        assert lines == [lines[0], f"tessera serve: web UI at {where.group(1)}/"]
        assert page.lstrip().lower().startswith("<!doctype html")

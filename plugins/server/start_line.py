"""The lines ``tessera serve`` prints once it listens: where, what it serves, and the web
page's address when a plugin serves one.

A page is a public ``GET /`` route in the runtime's route catalogue (the web UI plugin
registers one); the server knows no plugin that serves it, so a third-party UI is announced
the same way and none is announced when the web UI plugin is disabled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def serves_a_page(routes: Mapping[str, Any]) -> bool:
    """Whether a route plugin serves a page at ``/`` without the API key."""
    route = routes.get("GET /")
    return route is not None and bool(getattr(route, "public", False))


#: A wildcard address listens on every interface; a browser on this machine opens the
#: loopback one (some cannot open 0.0.0.0 at all).
_LOOPBACK = {"http://0.0.0.0:": "http://127.0.0.1:", "http://[::]:": "http://[::1]:"}


def page_url(address: str) -> str:
    """The URL a browser on this machine opens the page of ``address`` at."""
    for wildcard, loopback in _LOOPBACK.items():
        if address.startswith(wildcard):
            return loopback + address[len(wildcard) :] + "/"
    return address + "/"


def start_lines(addresses: Sequence[str], names: str, routes: Mapping[str, Any]) -> list[str]:
    """``tessera serve: ADDRESSES (NAMES)``, then ``tessera serve: web UI at URL/`` for each
    HTTP address when a page is served (a UNIX socket is no address for a browser)."""
    lines = [f"tessera serve: {', '.join(addresses)} ({names})"]
    if serves_a_page(routes):
        urls = list(dict.fromkeys(page_url(a) for a in addresses if a.startswith("http")))
        if urls:
            lines.append(f"tessera serve: web UI at {', '.join(urls)}")
    return lines

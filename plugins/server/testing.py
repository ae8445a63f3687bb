"""A live ``tessera serve`` on a free loopback port, in a thread, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from tessera.cli.main import build_parser
from tessera.plugin_manager import Runtime


@attrs.frozen
class LiveServer:
    """A running server: its base URL (``http://127.0.0.1:PORT``) and its state."""

    url: str
    state: Any

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def model(self) -> Any:
        """The default :class:`tessera.plugins.server.state.ServedModel` (model, tokenizer,
        engine)."""
        return self.state.pool.served()[0]


@contextlib.contextmanager
def live_server(argv: Sequence[str] = (), runtime: Runtime | None = None) -> Iterator[LiveServer]:
    """Start ``tessera serve ARGV --port 0`` in this process; stop it on exit.

    The server runs exactly the code of the CLI command (same flags, same app) on a port
    the OS picks, bound to 127.0.0.1.
    """
    runtime = runtime or Runtime()
    args = build_parser(runtime).parse_args(["serve", *argv, "--host", "127.0.0.1", "--port", "0"])
    from tessera.plugins.server import serve

    sock = serve.bind(args.host, args.port)
    state = serve.build_state(args, runtime)
    server = serve.server(serve.build_app(state, runtime), args.shutdown_timeout, state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        yield LiveServer(url, state)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()

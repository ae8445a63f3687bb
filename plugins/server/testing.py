"""A live ``tessera serve`` on a free loopback port, in a thread, for tests and benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tessera.cli.main import build_parser
from tessera.plugin_manager import Runtime


@attrs.frozen
class LiveServer:
    """A running server: its base URL (``http://127.0.0.1:PORT``) and its state."""

    url: str
    state: Any
    #: Every address it listens on (``--host`` may name several).
    urls: tuple[str, ...] = ()

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def model(self) -> Any:
        """The default :class:`tessera.plugins.server.state.ServedModel` (model, tokenizer,
        engine)."""
        return self.state.pool.served()[0]


@contextlib.contextmanager
def live_server(
    argv: Sequence[str] = (), runtime: Runtime | None = None, host: str = "127.0.0.1"
) -> Iterator[LiveServer]:
    """Start ``tessera serve ARGV --host HOST --port 0`` in this process; stop it on exit.

    The server runs exactly the code of the CLI command (same flags, same app) on a port
    the OS picks, bound to ``host`` (loopback; comma-separated for several addresses). Its
    access log is off unless ``argv`` has a ``--log-format``.
    """
    runtime = runtime or Runtime()
    flags = ["serve", "--log-format", "off", *argv, "--host", host, "--port", "0"]
    args = build_parser(runtime).parse_args(flags)
    from tessera.plugins.server import serve

    socks = serve.bind(args.host, args.port)
    state = serve.build_state(args, runtime)
    server = serve.server(serve.build_app(state, runtime), args.shutdown_timeout, state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": socks}, daemon=True)
    thread.start()
    urls = tuple(serve.address(s) for s in socks)
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        with urllib.request.urlopen(urls[0] + "/health", timeout=10) as r:
            assert r.status == 200
        yield LiveServer(urls[0], state, urls)
    finally:
        server.should_exit = True
        thread.join(30)
        for sock in socks:
            sock.close()


class ScriptedEngine:
    """Stands in for a served model's slot engine where a test needs an answer the model
    would not write (a tool call, a thinking block): every request gets ``tokens`` as they
    are when it is submitted, one every ``delay_s``, and is kept in ``requests``; a
    cancelled one stops. Its finish reports ``t_prompt_ms`` and ``ms_per_token`` per
    token. Everything else (slots, context) is the real engine's; the template, parsing
    and HTTP are the real server's."""

    def __init__(
        self,
        real: Any,
        tokens: Sequence[int] = (),
        delay_s: float = 0.0,
        t_prompt_ms: float = 1.0,
        ms_per_token: float = 1.0,
    ) -> None:
        self.real, self.tokens, self.delay_s = real, list(tokens), delay_s
        self.t_prompt_ms, self.ms_per_token = t_prompt_ms, ms_per_token
        self.ctx, self.slots = real.ctx, real.slots
        self.requests: list[Any] = []

    def submit(self, request: Any, on_event: Any) -> _ScriptedTask:
        from tessera.engine.slot_types import FinishEvent, TokenEvent

        self.requests.append(request)
        task, tokens = _ScriptedTask(), list(self.tokens)

        def play() -> None:
            for t in tokens:
                if task.cancelled:
                    return
                on_event(TokenEvent(t))
                if self.delay_s:
                    time.sleep(self.delay_s)
            n, n_prompt = len(tokens), len(request.prompt)
            ms = n * self.ms_per_token
            on_event(FinishEvent("stop", n_prompt, 0, n, self.t_prompt_ms, ms, 0))

        threading.Thread(target=play, daemon=True).start()
        return task

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _ScriptedTask:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@contextlib.contextmanager
def scripted_answer(srv: LiveServer, text: str, **engine: Any) -> Iterator[ScriptedEngine]:
    """Inside the block, the server's default model answers ``text`` (its tokens, special
    ones read as such) to every request; yields the :class:`ScriptedEngine` (``engine``:
    its other settings)."""
    served = srv.model
    tokens = served.tokenizer.encode(text, add_special=False, parse_special=True)
    real = served.engine
    served.engine = ScriptedEngine(real, tokens, **engine)
    try:
        yield served.engine
    finally:
        served.engine = real


#: FIM token ids given to the bundled model by :func:`write_fim_model` (ordinary tokens of
#: its vocabulary: the layout, not the model's skill, is what tests check).
FIM_TEST_IDS: Mapping[str, int] = {
    "pre": 4090, "suf": 4091, "mid": 4092, "pad": 4093, "rep": 4094, "sep": 4095
}  # fmt: skip


def write_fim_model(path: str | os.PathLike[str], ids: Mapping[str, int] = FIM_TEST_IDS) -> Path:
    """A copy of the bundled model whose GGUF names FIM tokens
    (``tokenizer.ggml.fim_<role>_token_id`` for each role in ``ids``)."""
    from tessera.files.gguf import read_gguf
    from tessera.files.gguf_writer import write_gguf
    from tessera.files.load import default_model_path

    source = read_gguf(default_model_path())
    metadata = dict(source.metadata)
    metadata.update({f"tokenizer.ggml.fim_{role}_token_id": i for role, i in ids.items()})
    return write_gguf(path, metadata, source.tensors.values())


@attrs.frozen
class Answer:
    """An HTTP answer: status, headers (lower-case names), body bytes, and the body read
    as JSON (None if it is not) or as server-sent ``data:`` events."""

    status: int
    headers: Mapping[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        try:
            return json.loads(self.raw)
        except ValueError:
            return None

    @property
    def events(self) -> list[Any]:
        """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as text)."""
        out = []
        for line in self.raw.decode().splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                out.append(data if data == "[DONE]" else json.loads(data))
        return out


def call(
    url: str,
    body: Any = None,
    method: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> Answer:
    """Send ``body`` as JSON (bytes as they are; None: no body) and read the whole answer,
    error statuses included."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None and "Content-Type" not in req.headers:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Answer(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())

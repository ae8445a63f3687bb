"""``tessera serve``: flags, building the server, and running it under uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from tessera.cli.args import context_from_args, load_model_from_args
from tessera.engine.slots import SlotEngine, SlotSpec
from tessera.errors import TesseraError
from tessera.plugins.cmd.model_summary import model_summary
from tessera.plugins.server.state import ServedModel, ServerSettings, ServerState, SingleModelPool

from .serve_flags import add_arguments, server_settings
from .start_line import start_lines
from .watchdog import EXIT_UNHEALTHY, Watchdog

__all__ = ["add_arguments", "bind", "build_app", "build_state", "run", "server"]

log = logging.getLogger("tessera.server")


def _chat_template(value: str | None) -> str | None:
    if value and Path(value).is_file():
        return Path(value).read_text(encoding="utf-8")
    return value


def build_state(args: argparse.Namespace, runtime: Any) -> ServerState:
    """Load the model, make the context and the slot engine (not started); with
    --models-dir or several -m, a pool that loads models when requests name them."""
    settings = server_settings(args)
    paths = args.model or []
    if args.models_dir or len(paths) > 1:
        from tessera.plugins.server.model_pool import MultiModelPool

        models_dir = Path(args.models_dir) if args.models_dir else None
        if models_dir is not None and not models_dir.is_dir():
            raise TesseraError(
                f"--models-dir '{models_dir}' is not a directory; create it or pass another"
            )
        pool: Any = MultiModelPool(
            lambda name, path: load_served(args, runtime, settings, path, name),
            models_dir,
            [Path(p) for p in paths],
            args.models_max,
            args.models_autoload,
        )
    else:
        pool = SingleModelPool(load_served(args, runtime, settings, paths[0] if paths else None))
    return ServerState(runtime=runtime, settings=settings, pool=pool)


def slot_spec(args: argparse.Namespace, runtime: Any, ctx: Any) -> SlotSpec | None:
    """Speculative decoding for the slots when --spec-type (or -md) asks for it."""
    from tessera.plugins.spec.cli import spec_params_from_args, spec_type_from_args

    name = spec_type_from_args(args)
    if name is None:
        return None
    info = runtime.spec_decoder(name)
    params = spec_params_from_args(args)
    probe = info.create(ctx, params, runtime)  # a bad draft file fails here, at startup
    try:
        if probe.needs_all_prompt_outputs:
            raise TesseraError(
                f"--spec-type {name} reads the target's hidden state of one sequence, which "
                "the server's batches mix; use draft, ngram or select with tessera serve"
            )
    finally:
        probe.close()
    return SlotSpec(name, params, lambda: info.create(ctx, params, runtime))


def load_served(
    args: argparse.Namespace,
    runtime: Any,
    settings: ServerSettings,
    path: Any,
    name: str | None = None,
) -> ServedModel:
    """Load the model at ``path`` (None: the bundled one) with its context and engine."""
    model = load_model_from_args(argparse.Namespace(**{**vars(args), "model": path}), runtime)
    if model.tokenizer is None:
        raise TesseraError(f"'{model.path}' has no tokenizer; serve a model with a vocabulary")
    ctx = context_from_args(args, model)
    print(model_summary(model, ctx), file=sys.stderr, flush=True)
    engine = SlotEngine(
        ctx,
        eog_ids=model.tokenizer.eog_ids,
        max_queue=args.max_queue,
        prompt_store_bytes=max(args.cache_ram, 0) << 20,
        spec=slot_spec(args, runtime, ctx),
        stall_after_s=args.watchdog_s,
    )
    return ServedModel(
        name=name or settings.alias or Path(model.path).name,
        path=str(model.path),
        model=model,
        tokenizer=model.tokenizer,
        engine=engine,
        chat_template=_chat_template(args.chat_template),
        settings=settings,
        runtime=runtime,
    )


def build_app(state: ServerState, runtime: Any) -> Any:
    """The ASGI app over every registered route; the engine runs while the app does."""
    from .app import build_app as assemble

    @contextlib.asynccontextmanager
    async def lifespan(app: Any):
        state.pool.start()
        try:
            yield
        finally:
            state.pool.close()  # cancels what is still running; slot files are atomic

    return assemble(state, runtime.routes().values(), lifespan)


def _bind_one(host: str, port: int) -> socket.socket:
    if host.endswith(".sock"):  # a UNIX socket path, as llama-server takes one
        family, address = socket.AF_UNIX, host
    else:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        address = (host.strip("[]"), port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # with several addresses, :: means IPv6 only (its IPv4 twin may be listed too)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise TesseraError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port or --host"
        ) from None
    sock.listen(128)
    return sock


def bind(hosts: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address of ``hosts`` (comma-separated), all on one port
    (port 0: the one the OS picks for the first), or one clear error naming the address
    and the way out."""
    socks: list[socket.socket] = []
    try:
        for host in (h.strip() for h in hosts.split(",") if h.strip()):
            socks.append(_bind_one(host, port))
            if port == 0 and socks[-1].family != socket.AF_UNIX:
                port = socks[-1].getsockname()[1]
    except BaseException:
        for s in socks:
            s.close()
        raise
    if not socks:
        raise TesseraError("--host names no address; pass one, e.g. --host 127.0.0.1")
    return socks


def address(sock: socket.socket) -> str:
    """``http://host:port`` (or the socket path) a client reaches ``sock`` at."""
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def server(app: Any, shutdown_timeout: float = 10.0, state: ServerState | None = None) -> Any:
    """uvicorn's server, with tessera's shutdown: on the first SIGTERM/SIGINT new requests
    get 503 (``state.draining``), running ones have ``shutdown_timeout`` seconds, then are
    cut with an error event and ``[DONE]``; uvicorn's own grace period is a little longer,
    so it never has to cancel a handler (which would print tracebacks)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state is not None and not state.draining:
                state.draining = True
                timer = threading.Timer(shutdown_timeout, _cut_running, args=(state,))
                timer.daemon = True
                timer.start()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn raises SIGTERM again after its graceful shutdown, so the process would
            # die by the signal; a clean stop here ends with exit code 0 instead
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            signals = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_graceful_shutdown=shutdown_timeout + 0.75,
        lifespan="on",
    )
    return Server(config)


def run(args: argparse.Namespace, runtime: Any) -> int:
    socks = bind(args.host, args.port)
    state = build_state(args, runtime)
    app = build_app(state, runtime)
    names = ", ".join(m.name for m in state.pool.served()) or args.models_dir or "models"
    for line in start_lines([address(s) for s in socks], names, runtime.routes()):
        print(line, file=sys.stderr, flush=True)
    srv = server(app, args.shutdown_timeout, state)
    watchdog = Watchdog(state, srv)
    threading.Thread(target=watchdog.watch, name="tessera-watchdog", daemon=True).start()
    srv.run(sockets=socks)
    if watchdog.reason is not None:
        print(f"error: {watchdog.reason}; the server stopped", file=sys.stderr)
        return EXIT_UNHEALTHY
    return 0


def _cut_running(state: ServerState) -> None:
    """The grace period is over: end every running request, saying so to its client."""
    for served in state.pool.served():
        served.engine.cancel_all(
            "the server is shutting down and the request ran past --shutdown-timeout; "
            "retry on another instance"
        )

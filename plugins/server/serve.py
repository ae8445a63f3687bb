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

from tessera.cli.args import add_model_arguments, context_from_args, load_model_from_args
from tessera.engine.slots import SlotEngine, SlotSpec
from tessera.errors import TesseraError
from tessera.plugins.server.state import ServedModel, ServerSettings, ServerState, SingleModelPool

from .watchdog import EXIT_UNHEALTHY, Watchdog

log = logging.getLogger("tessera.server")

DEFAULT_PORT = 9931  # llama.cpp 0.7.0's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera.plugins.spec.cli import add_spec_arguments

    add_model_arguments(parser, several_models=True)
    add_spec_arguments(parser)
    parser.set_defaults(parallel=4)
    g = parser.add_argument_group("server")
    g.add_argument(
        "--models-dir",
        default=None,
        help="serve every GGUF file and HF folder in DIR, loaded on demand by the model field",
    )
    g.add_argument(
        "--models-max",
        type=int,
        default=4,
        help="models loaded at once with --models-dir or several -m (least recently used out)",
    )
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 9931)")
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    g.add_argument("-a", "--alias", default="", help="model name shown to clients")
    g.add_argument("--chat-template", default=None, help="Jinja chat template (text or file)")
    g.add_argument("--slot-save-path", default=None, help="directory for slot save/restore files")
    g.add_argument(
        "--max-body-mib", type=float, default=1.0, help="largest request body (MiB, 413 above)"
    )
    g.add_argument(
        "--max-tokens-cap", type=int, default=-1, help="upper bound on any request's max_tokens"
    )
    g.add_argument(
        "--max-queue", type=int, default=64, help="requests that may wait for a slot (503 above)"
    )
    g.add_argument(
        "--cache-ram",
        type=int,
        default=256,
        help="MiB of saved prompt states kept when slots are reused (0 = off)",
    )
    g.add_argument(
        "--pooling",
        choices=["none", "mean", "cls", "last", "rank"],
        default=None,
        help="pooling of /v1/embeddings (default: the model's own)",
    )
    g.add_argument(
        "--embd-normalize", type=int, default=2, help="-1 none, 0 max-abs, 1 taxicab, 2 L2"
    )
    g.add_argument(
        "--watchdog-s",
        type=float,
        default=600.0,
        help="seconds a decode step may take with requests running before the server calls "
        "itself stalled: /health answers 503 and the process exits non-zero (a supervisor "
        "restarts it)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get to finish on SIGTERM before they are cancelled",
    )


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
        )
    else:
        pool = SingleModelPool(load_served(args, runtime, settings, paths[0] if paths else None))
    return ServerState(runtime=runtime, settings=settings, pool=pool)


def server_settings(args: argparse.Namespace) -> ServerSettings:
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        max_body_bytes=int(args.max_body_mib * (1 << 20)),
        max_tokens_cap=args.max_tokens_cap,
        slot_save_path=Path(args.slot_save_path) if args.slot_save_path else None,
        alias=args.alias,
        pooling=args.pooling,
        embd_normalize=args.embd_normalize,
    )
    if settings.slot_save_path is not None:
        settings.slot_save_path.mkdir(parents=True, exist_ok=True)
    return settings


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


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one clear error naming the address and the way out."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise TesseraError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pass another --port or --host"
        ) from None
    sock.listen(128)
    return sock


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
    sock = bind(args.host, args.port)
    state = build_state(args, runtime)
    app = build_app(state, runtime)
    host, port = sock.getsockname()[:2]
    names = ", ".join(m.name for m in state.pool.served()) or args.models_dir or "models"
    print(f"tessera serve: http://{host}:{port} ({names})", file=sys.stderr, flush=True)
    srv = server(app, args.shutdown_timeout, state)
    watchdog = Watchdog(state, srv)
    threading.Thread(target=watchdog.watch, name="tessera-watchdog", daemon=True).start()
    srv.run(sockets=[sock])
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

"""The flags of ``tessera serve`` and the :class:`ServerSettings` they make.

Names and defaults follow llama-server where it has the flag (``--host`` takes a
comma-separated list, ``--api-key`` several keys, ``--cors-*``, ``--slots``/``--no-slots``,
``--props``, ``--spm-infill``); ``--metrics`` is on by default here (llama-server's is off).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tessera.cli.args import (
    add_model_arguments,
    add_sampling_arguments,
    int_at_least,
    sampler_params_from_args,
)
from tessera.errors import TesseraError
from tessera.plugins.server.state import ServerSettings

from .access_log import LOG_FORMATS

DEFAULT_PORT = 9931  # llama.cpp 0.7.0's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera.plugins.spec.cli import add_spec_arguments

    add_model_arguments(parser, several_models=True)
    add_spec_arguments(parser)
    # as llama-server: the defaults of a request that does not set them
    add_sampling_arguments(parser)
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
        help="models loaded at once with --models-dir or several -m (least recently used "
        "out; 0 = no limit)",
    )
    g.add_argument(
        "--models-autoload",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="load a model a request names when it is not loaded (default: yes; off: such a "
        "request is refused until POST /models/load loads it)",
    )
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="addresses to bind, comma-separated; a path ending in .sock is a UNIX socket "
        "(default 127.0.0.1)",
    )
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 9931)")
    g.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (or 'X-Api-Key: KEY'); several keys "
        "comma-separated",
    )
    g.add_argument(
        "--api-key-file", default=None, help="file of API keys, one a line ('#' comments)"
    )
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
        "-n",
        "--n-predict",
        type=int_at_least(-1),
        default=None,
        help="tokens to generate when a request does not say (-1: until the end; default: "
        "each API's own, 16 for /v1/completions, -1 elsewhere)",
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
    _add_endpoint_arguments(g)


def _add_endpoint_arguments(g: argparse._ArgumentGroup) -> None:
    on_off = argparse.BooleanOptionalAction
    g.add_argument("--slots", action=on_off, default=True, help="GET /slots (off: 501)")
    g.add_argument("--metrics", action=on_off, default=True, help="GET /metrics (off: 501)")
    g.add_argument("--props", action="store_true", help="allow POST /props (else 501)")
    g.add_argument(
        "--spm-infill", action="store_true", help="/infill: suffix before prefix (SPM order)"
    )
    g.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="access log, one line per request on stderr: method, path, status, duration, "
        "tokens (default text; off: none)",
    )
    g.add_argument(
        "--cors-origins",
        default="*",
        help="origins allowed to call from a browser: * (default: any, the Origin echoed), "
        "localhost, or a comma-separated list",
    )
    g.add_argument(
        "--cors-methods",
        default="GET, POST, DELETE, OPTIONS",
        help="methods a CORS preflight allows",
    )
    g.add_argument("--cors-headers", default="*", help="headers a CORS preflight allows")
    g.add_argument(
        "--cors-credentials",
        action=on_off,
        default=True,
        help="let browsers send credentials cross-origin (default: yes)",
    )


def _api_keys(args: argparse.Namespace) -> list[str]:
    keys = [k.strip() for k in (args.api_key or "").split(",") if k.strip()]
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TesseraError(
                f"cannot read --api-key-file '{args.api_key_file}' ({exc.strerror}); "
                "pass a readable file of keys, one a line"
            ) from None
        keys += [k.strip() for k in lines if k.strip() and not k.lstrip().startswith("#")]
    return keys


def server_settings(args: argparse.Namespace) -> ServerSettings:
    keys = _api_keys(args)
    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=keys[0] if keys else None,
        more_api_keys=tuple(keys[1:]),
        max_body_bytes=int(args.max_body_mib * (1 << 20)),
        max_tokens_cap=args.max_tokens_cap,
        slot_save_path=Path(args.slot_save_path) if args.slot_save_path else None,
        alias=args.alias,
        pooling=args.pooling,
        embd_normalize=args.embd_normalize,
        endpoint_slots=args.slots,
        endpoint_metrics=args.metrics,
        endpoint_props=args.props,
        cors_origins=args.cors_origins,
        cors_methods=args.cors_methods,
        cors_headers=args.cors_headers,
        cors_credentials=args.cors_credentials,
        spm_infill=args.spm_infill,
        log_format=args.log_format,
        sampler=sampler_params_from_args(args),
        n_predict=args.n_predict,
    )
    if settings.slot_save_path is not None:
        settings.slot_save_path.mkdir(parents=True, exist_ok=True)
    return settings

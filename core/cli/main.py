"""The ``tessera`` command line: a skeleton whose subcommands come from plugins.

Only ``tessera plugins`` lives in core, so that the plugin set can always be inspected.
Errors a user can act on (:class:`TesseraError`, and an ``OSError`` no command turned into
one) print as one line and a non-zero exit; ``--verbose`` also shows the traceback.
The ``tessera`` program (:func:`entry`) ends through :func:`exit_process`.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

from tessera import __version__, switches
from tessera.cli.plugins_cmd import add_plugins_arguments, run_plugins
from tessera.errors import TesseraError
from tessera.plugin_manager import PluginFailure, Runtime


def _global_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--verbose", "-v", action="store_true", help="log details and tracebacks")
    parser.add_argument(
        "--disable-plugins",
        default="",
        metavar="A,B",
        help="entry-point names of plugins not to load (also TESSERA_DISABLE_PLUGINS)",
    )
    return parser


def build_parser(runtime: Runtime) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera",
        description="tessera: run, serve and test LLMs locally; every feature is a plugin.",
        parents=[_global_parser()],
    )
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins = sub.add_parser("plugins", help="list plugins, their hooks and backend capabilities")
    add_plugins_arguments(plugins)
    plugins.set_defaults(run=run_plugins)
    for command in sorted(runtime.commands().values(), key=lambda c: c.name):
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(run=command.run)
    return parser


def _warn(failure: PluginFailure) -> None:
    print(
        f"warning: plugin '{failure.name}' skipped: {failure.error} (tessera runs without it; "
        f"--disable-plugins {failure.name} stops loading it)",
        file=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    early, _ = _global_parser().parse_known_args(argv)
    logging.basicConfig(
        level=logging.INFO if early.verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        runtime = Runtime(
            disabled=[n for n in early.disable_plugins.split(",") if n], on_failure=_warn
        )
        parser = build_parser(runtime)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args.run(args, runtime) or 0)
    except TesseraError as exc:
        if early.verbose:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a file a command could not open that no check named first
        if early.verbose:
            traceback.print_exc()
        where = f"'{exc.filename}': " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def exit_choice() -> switches.Choice:
    """Whether :func:`exit_process` may skip the interpreter's teardown: not while another
    non-daemon thread runs (a normal exit waits for it), nor with TESSERA_FAST_EXIT_DISABLE=1."""

    def probe() -> tuple[bool, str]:
        me = threading.current_thread()
        others = [t.name for t in threading.enumerate() if not t.daemon and t is not me]
        return (False, f"thread {others[0]!r} still runs") if others else (True, "no other thread")

    return switches.choose(switches.FAST_EXIT_DISABLE, probe, on="fast", off="teardown")


def exit_process(code: int) -> NoReturn:
    """End the process with exit status ``code`` as a normal exit would, minus the teardown.

    After a command, the interpreter's teardown (every module freed, torch's C++ statics
    destroyed) costs ~0.3 s and nothing in it is work a finished command needs. So the exit
    handlers run (``atexit``: logging's flush, temporary folders, child processes), the
    standard streams are flushed (status 120 if stdout cannot be, as Python does) and the
    process ends there. Falls back to ``sys.exit`` where :func:`exit_choice` says so.
    """
    if exit_choice().path != "fast":
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe: Python's own exit reports status 120
        code = code or 120
    try:
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr gone too: there is nowhere left to say so
        pass
    os._exit(code)


def entry() -> NoReturn:
    """The ``tessera`` program: :func:`main` on ``sys.argv``, then :func:`exit_process`."""
    exit_process(main())


if __name__ == "__main__":
    entry()

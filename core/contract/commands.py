"""The data a command plugin registers: one ``tessera`` subcommand."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen
class Command:
    """A CLI subcommand. ``run(args, runtime)`` returns the process exit code."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] = attrs.field(eq=False, repr=False)
    run: Callable[[argparse.Namespace, Any], int] = attrs.field(eq=False, repr=False)

"""The commands a command-plugin module registers, for testing them without the CLI."""

from __future__ import annotations

import importlib

from tessera import PLUGIN_API_VERSION
from tessera.contract.commands import Command


def registered_command(module_name: str, name: str) -> Command:
    """Import ``module_name`` as the loader would and return its registered command ``name``.

    Asserts the module declares this tessera's plugin-API version and registers exactly
    that one command.
    """
    module = importlib.import_module(module_name)
    assert module.TESSERA_PLUGIN_API == PLUGIN_API_VERSION
    commands: list[Command] = []
    module.tessera_register_commands(commands.append)
    assert [c.name for c in commands] == [name]
    return commands[0]

"""``python -m tessera``: the same CLI as the ``tessera`` command."""

from tessera.cli.main import entry

entry()

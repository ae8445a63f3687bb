"""``python -m tessera``: the same CLI as the ``tessera`` command."""

from tessera.cli import main

raise SystemExit(main())

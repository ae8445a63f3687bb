"""The ``tessera`` command line: the skeleton, the shared model flags and ``tessera plugins``."""

"""JSON-constrained sampling: an incremental JSON validator and the allowed-token masks it
gives.

This package's root is its public module: the server imports
:class:`JsonConstraintFactory` from here, and nothing else of it.
"""

from tessera.plugins.json_constraint.constraint import JsonConstraintFactory

__all__ = ["JsonConstraintFactory"]

"""JSON-constrained sampling: an incremental JSON validator and the allowed-token masks it
gives.

This package's root is its public module: the server imports
:class:`JsonConstraintFactory` and the package's switches (:data:`SWITCHES`, which the
server registers) from here, and nothing else of it.
"""

from tessera.plugins.json_constraint.constraint import REJECTION, VECTOR, JsonConstraintFactory

#: The package's environment switches.
SWITCHES = (REJECTION, VECTOR)

__all__ = ["SWITCHES", "JsonConstraintFactory"]

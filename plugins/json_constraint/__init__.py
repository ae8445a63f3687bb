"""JSON-constrained sampling: an incremental JSON validator and the allowed-token masks it gives."""

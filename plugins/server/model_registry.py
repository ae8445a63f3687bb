"""The registry of ``tessera serve --models-dir``: which models exist (files and folders of
the models directory, and explicit ``-m`` paths), their file facts, and the status object
llama-server's router gives each of them on ``GET /models``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from tessera.contract.routes import ApiError
from tessera.errors import TesseraError
from tessera.plugins.server.model_files import (
    ModelFileInfo,
    ModelFlags,
    inspect_model,
    scan_models_dir,
)
from tessera.plugins.server.state import ServedModel

#: The states of a registered model ("downloading" is a download's, see the web UI).
STATES = ("on_disk", "loading", "loaded", "failed")
#: llama-server's ``status.value`` of each state; a failed load is "unloaded" with
#: ``failed: true``.
ROUTER_STATUS = {"on_disk": "unloaded", "loading": "loading", "loaded": "loaded"}


@attrs.define(eq=False)
class ModelEntry:
    """One model the pool knows: where it is, and whether it is loaded."""

    name: str
    path: Path
    in_models_dir: bool  # found in the models directory: the only ones that may be deleted
    state: str = "on_disk"
    error: str | None = None
    served: ServedModel | None = None
    last_used: float = 0.0
    users: set[Any] = attrs.field(factory=set)  # tasks of the requests that acquired it
    loading: asyncio.Future | None = None
    info: ModelFileInfo | None = None
    info_key: tuple[int, int] = (0, 0)


def router_status(entry: ModelEntry) -> dict[str, Any]:
    """``entry``'s ``status`` object as llama-server's router lists it: ``value`` (unloaded,
    loading, loaded) and, after a failed load, ``failed``, ``exit_code`` and the error."""
    if entry.state == "failed":
        # llama-server's instance exits with 1 when its model does not load
        return {"value": "unloaded", "failed": True, "exit_code": 1, "error": entry.error}
    return {"value": ROUTER_STATUS[entry.state]}


def _stat_key(path: Path) -> tuple[int, int]:
    st = (path / "config.json" if path.is_dir() else path).stat()
    return st.st_mtime_ns, st.st_size


class ModelRegistry:
    """Models found in ``models_dir`` and given as ``paths``, by name."""

    def __init__(self, models_dir: Path | None = None, paths: Sequence[Path] = ()) -> None:
        self.models_dir = models_dir.resolve() if models_dir is not None else None
        self.flags = ModelFlags.load(self.models_dir)
        self._entries: dict[str, ModelEntry] = {}
        for path in paths:
            path = Path(path).resolve()
            inside = self.models_dir is not None and path.parent == self.models_dir
            self._add(ModelEntry(path.name, path, inside))
        self.refresh()

    def _add(self, entry: ModelEntry) -> None:
        if entry.name in self._entries and self._entries[entry.name].path != entry.path:
            raise TesseraError(
                f"two models are named '{entry.name}' ({self._entries[entry.name].path} and "
                f"{entry.path}); rename one of them"
            )
        self._entries.setdefault(entry.name, entry)

    def refresh(self) -> None:
        """Pick up files added to the models directory and drop those gone from it."""
        if self.models_dir is None:
            return
        found = scan_models_dir(self.models_dir)
        for name, entry in list(self._entries.items()):
            if entry.in_models_dir and name not in found and entry.state != "loaded":
                del self._entries[name]
        for name, path in found.items():
            if name not in self._entries:
                self._add(ModelEntry(name, path, True))

    def entries(self) -> list[ModelEntry]:
        self.refresh()
        return list(self._entries.values())

    def entry(self, name: str) -> ModelEntry:
        """The model called ``name``; ApiError 404 naming the available ones."""
        if name not in self._entries:
            self.refresh()
        if name not in self._entries:
            available = ", ".join(sorted(self._entries)) or "none"
            raise ApiError(
                404,
                f"model '{name}' is not served here; available models: {available}",
                "model",
                code="model_not_found",
            )
        return self._entries[name]

    def info(self, entry: ModelEntry) -> ModelFileInfo:
        """The file's header facts, read again only when the file changed (any thread)."""
        key = _stat_key(entry.path)
        if entry.info is None or entry.info_key != key:
            entry.info, entry.info_key = inspect_model(entry.path), key
        return entry.info

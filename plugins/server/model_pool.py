"""A pool of many models for ``tessera serve --models-dir``: which models exist, which
are loaded, and loading or unloading them on demand.

Requests name their model in the OpenAI ``model`` field. A model not loaded yet is
loaded off the event loop (one load however many requests wait for it); when
``models_max`` models are loaded already, the least recently used one that no request
is using is unloaded first. A model is *in use* while a request that acquired it is
still being answered (its asyncio task has not ended) or its slot engine has work.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from tessera.contract.routes import ApiError
from tessera.plugins.server.model_files import (
    ModelFileInfo,
    ModelFlags,
    inspect_model,
    scan_models_dir,
)
from tessera.plugins.server.state import ModelPool, ServedModel, describe_model

#: The states of a registered model ("downloading" is a download's, see the web UI).
STATES = ("on_disk", "loading", "loaded", "failed")


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


def _stat_key(path: Path) -> tuple[int, int]:
    st = (path / "config.json" if path.is_dir() else path).stat()
    return st.st_mtime_ns, st.st_size


class MultiModelPool(ModelPool):
    """Models from ``models_dir`` and explicit paths, at most ``models_max`` loaded."""

    def __init__(
        self,
        loader: Callable[[str, Path], ServedModel],
        models_dir: Path | None = None,
        paths: Sequence[Path] = (),
        models_max: int = 4,
    ) -> None:
        self.loader = loader
        self.models_dir = models_dir.resolve() if models_dir is not None else None
        self.models_max = max(1, models_max)
        self.flags = ModelFlags.load(self.models_dir)
        #: Called on close (plugins stop their work here, e.g. downloads).
        self.on_close: list[Callable[[], None]] = []
        self._entries: dict[str, ModelEntry] = {}
        self._started = False
        for path in paths:
            path = Path(path).resolve()
            inside = self.models_dir is not None and path.parent == self.models_dir
            self._add(ModelEntry(path.name, path, inside))
        self.refresh()

    def _add(self, entry: ModelEntry) -> None:
        if entry.name in self._entries and self._entries[entry.name].path != entry.path:
            from tessera.errors import TesseraError

            raise TesseraError(
                f"two models are named '{entry.name}' ({self._entries[entry.name].path} and "
                f"{entry.path}); rename one of them"
            )
        self._entries.setdefault(entry.name, entry)

    # -- the registry ---------------------------------------------------------------

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

    def summary(self, entry: ModelEntry) -> dict[str, Any]:
        """What the Models Manager shows of a model (reads its header: not on the loop)."""
        info, served = self.info(entry), entry.served
        return {
            "name": entry.name,
            "path": str(entry.path),
            "size": info.size,
            "arch": info.arch,
            "quant": info.quant,
            "n_ctx_train": info.n_ctx_train,
            "n_ctx": served.engine.ctx.n_ctx if served is not None else None,
            "state": entry.state,
            "error": entry.error or info.error,
            "in_use": self.busy(entry),
            "deletable": entry.in_models_dir,
            "hidden": entry.name in self.flags.hidden,
            "favourite": entry.name in self.flags.favourite,
        }

    # -- ModelPool --------------------------------------------------------------------

    async def acquire(self, name: str | None) -> ServedModel:
        entry = self._default() if name is None else self.entry(name)
        task = asyncio.current_task()
        if task is not None:
            entry.users.add(task)
            task.add_done_callback(entry.users.discard)
        entry.last_used = time.monotonic()
        served = await self.load(entry)
        entry.last_used = time.monotonic()
        return served

    def _default(self) -> ModelEntry:
        loaded = [e for e in self._entries.values() if e.state == "loaded"]
        if loaded:
            return max(loaded, key=lambda e: e.last_used)
        entries = self.entries()
        if len(entries) == 1:
            return entries[0]
        names = ", ".join(sorted(self._entries)) or "none"
        raise ApiError(
            400, f"this server serves several models; name one in 'model' ({names})", "model"
        )

    def served(self) -> list[ServedModel]:
        return [e.served for e in self._entries.values() if e.served is not None]

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for e in self.entries():
            if e.served is not None:
                item = describe_model(e.served)
            else:
                item = {"id": e.name, "object": "model", "created": 0, "owned_by": "tessera"}
            item["status"] = {"value": e.state, **({"error": e.error} if e.error else {})}
            out.append(item)
        return out

    def start(self) -> None:
        self._started = True
        super().start()

    def close(self) -> None:
        for stop in self.on_close:
            stop()
        super().close()
        self._started = False

    # -- loading and unloading ---------------------------------------------------------

    def busy(self, entry: ModelEntry) -> bool:
        """True while a request other than the current one uses the model."""
        try:
            current = asyncio.current_task()
        except RuntimeError:  # not on the event loop (a summary on a worker thread)
            current = None
        # a copy: summaries run on a worker thread while the loop edits the set
        if any(not t.done() and t is not current for t in tuple(entry.users)):
            return True
        engine = entry.served.engine if entry.served is not None else None
        return engine is not None and (
            engine.n_queued > 0 or any(s.task is not None for s in engine.slots)
        )

    async def load(self, entry: ModelEntry) -> ServedModel:
        """The loaded model of ``entry``, loading it first (once for all who wait)."""
        if entry.served is not None:
            return entry.served
        if entry.loading is None:
            self._make_room(entry)
            entry.loading = asyncio.get_running_loop().create_future()
            entry.state, entry.error = "loading", None
            try:
                served = await asyncio.to_thread(self.loader, entry.name, entry.path)
            except Exception as exc:  # any load failure is reported on the model's row
                entry.state, entry.error = "failed", str(exc)
                entry.loading.set_exception(
                    ApiError(500, f"cannot load model '{entry.name}': {exc}", "model")
                )
            else:
                if self._started:
                    served.engine.start()
                entry.served, entry.state = served, "loaded"
                entry.loading.set_result(served)
            loading, entry.loading = entry.loading, None
            loading.exception()  # retrieved: no "never retrieved" warning without waiters
            return await loading
        return await asyncio.shield(entry.loading)

    def _make_room(self, entry: ModelEntry) -> None:
        """Unload least recently used models until one more fits under ``models_max``."""
        held = [e for e in self._entries.values() if e.served is not None or e.loading is not None]
        while len(held) >= self.models_max:
            idle = [e for e in held if e.served is not None and not self.busy(e)]
            if not idle:
                raise ApiError(
                    503,
                    f"cannot load '{entry.name}': all {len(held)} loaded models are in use "
                    "(--models-max); retry later or start the server with a larger --models-max",
                )
            victim = min(idle, key=lambda e: e.last_used)
            self._detach(victim)
            held.remove(victim)

    def _detach(self, entry: ModelEntry) -> None:
        """Forget ``entry``'s loaded model and stop its engine (a thread join: off the loop)."""
        served, entry.served = entry.served, None
        entry.state = "on_disk"
        if served is not None:
            threading.Thread(target=served.engine.stop, name="tessera-unload", daemon=True).start()

    async def unload(self, entry: ModelEntry) -> None:
        """Unload ``entry``; ApiError 409 while a request uses it."""
        if entry.loading is not None:
            raise ApiError(409, f"model '{entry.name}' is loading; unload it once it is loaded")
        if self.busy(entry):
            raise ApiError(
                409, f"model '{entry.name}' is answering requests; unload it when they end"
            )
        served, entry.served = entry.served, None
        entry.state, entry.error = "on_disk", None
        if served is not None:
            await asyncio.to_thread(served.engine.stop)

    async def delete(self, entry: ModelEntry, force: bool = False) -> None:
        """Delete ``entry``'s file or folder from the models directory."""
        if not entry.in_models_dir or self.models_dir is None:
            raise ApiError(
                403,
                f"model '{entry.name}' is not in the models directory; only files there can "
                "be deleted",
            )
        path = entry.path.resolve()
        if path.parent != self.models_dir:  # a link leading out of the directory
            raise ApiError(
                403, f"model '{entry.name}' points outside the models directory; not deleted"
            )
        if entry.served is not None or entry.loading is not None:
            if not force:
                raise ApiError(
                    409,
                    f"model '{entry.name}' is loaded; unload it first or pass force: true",
                )
            await self.unload(entry)
        if entry.path.is_dir() and not entry.path.is_symlink():
            await asyncio.to_thread(shutil.rmtree, entry.path)
        else:
            entry.path.unlink()
        del self._entries[entry.name]
        self.flags.forget(entry.name)

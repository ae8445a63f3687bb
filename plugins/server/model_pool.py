"""A pool of many models for ``tessera serve --models-dir``: loading and unloading them
on demand, as llama-server's router does.

Requests name their model in the ``model`` field (GET routes: the ``?model=`` query
parameter). A model not loaded yet is loaded off the event loop (one load however many
requests wait for it), unless autoload is off (``--no-models-autoload``, or a request's
``?autoload=false``): then it is refused until ``POST /models/load`` loads it. When
``models_max`` models are loaded already (0: no limit), the least recently used one that
no request is using is unloaded first. A model is *in use* while a request that acquired
it is still being answered (its asyncio task has not ended) or its slot engine has work.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tessera.contract.routes import ApiError
from tessera.plugins.server.model_registry import (
    STATES,
    ModelEntry,
    ModelRegistry,
    router_status,
)
from tessera.plugins.server.state import ModelPool, ServedModel, describe_model

__all__ = ["STATES", "ModelEntry", "MultiModelPool"]


class MultiModelPool(ModelRegistry, ModelPool):
    """Models from ``models_dir`` and explicit paths, at most ``models_max`` loaded."""

    def __init__(
        self,
        loader: Callable[[str, Path], ServedModel],
        models_dir: Path | None = None,
        paths: Sequence[Path] = (),
        models_max: int = 4,
        autoload: bool = True,
    ) -> None:
        super().__init__(models_dir, paths)
        self.loader = loader
        #: Most models loaded at once; 0 = no limit (llama-server's --models-max).
        self.models_max = max(0, models_max)
        #: Load a model a request names when it is not loaded (--models-autoload).
        self.autoload = autoload
        #: Called on close (plugins stop their work here, e.g. downloads).
        self.on_close: list[Callable[[], None]] = []
        self._started = False
        self._loads: set[asyncio.Task] = set()  # running loads (held: tasks are weakly kept)

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

    async def acquire(self, name: str | None, autoload: bool | None = None) -> ServedModel:
        entry = self._default() if name is None else self.entry(name)
        if entry.served is None and entry.loading is None:
            if not (self.autoload if autoload is None else autoload):
                raise ApiError(
                    400,
                    f"model '{entry.name}' is not loaded and this request does not load it "
                    "(--no-models-autoload or ?autoload=false); load it with POST /models/load "
                    "first",
                    "model",
                )
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
            item["status"] = router_status(e)
            item["architecture"] = {"input_modalities": ["text"], "output_modalities": ["text"]}
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
        return await asyncio.shield(self.begin_load(entry))

    def begin_load(self, entry: ModelEntry) -> asyncio.Future:
        """Start loading ``entry`` (on a worker thread) unless it is loading already; the
        future of its load. ApiError 503 when every loaded model is in use."""
        if entry.loading is None:
            self._make_room(entry)
            entry.loading = asyncio.get_running_loop().create_future()
            entry.state, entry.error = "loading", None
            task = asyncio.get_running_loop().create_task(self._load(entry, entry.loading))
            self._loads.add(task)
            task.add_done_callback(self._loads.discard)
        return entry.loading

    async def _load(self, entry: ModelEntry, done: asyncio.Future) -> None:
        try:
            served = await asyncio.to_thread(self.loader, entry.name, entry.path)
        except Exception as exc:  # any load failure is reported on the model's row
            entry.state, entry.error = "failed", str(exc)
            done.set_exception(ApiError(500, f"cannot load model '{entry.name}': {exc}", "model"))
            done.exception()  # retrieved: no "never retrieved" warning without waiters
        else:
            if self._started:
                served.engine.start()
            entry.served, entry.state = served, "loaded"
            entry.last_used = time.monotonic()  # a load is a use: the newest is not the first out
            done.set_result(served)
        entry.loading = None

    def _make_room(self, entry: ModelEntry) -> None:
        """Unload least recently used models until one more fits under ``models_max``."""
        held = [e for e in self._entries.values() if e.served is not None or e.loading is not None]
        while self.models_max and len(held) >= self.models_max:
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

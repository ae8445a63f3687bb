"""The Models Manager's JSON API: list, one model's metadata, load, unload, delete, hide,
favourite, and the downloads. Every route needs the API key when the server has one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError
from tessera.plugins.server.fields import Fields, read_json
from tessera.plugins.server.model_pool import ModelEntry, MultiModelPool
from tessera.plugins.server.state import ServerState

from .downloads import Downloads
from .model_details import model_details


def _state(request: Request) -> ServerState:
    return request.app.state.tessera


def _pool(request: Request) -> MultiModelPool:
    pool = _state(request).pool
    if not isinstance(pool, MultiModelPool):
        raise ApiError(
            400,
            "this server serves one model (-m); start it with --models-dir DIR (or several -m) "
            "to load, unload and manage models",
        )
    return pool


def _downloads(request: Request) -> Downloads:
    state, pool = _state(request), _pool(request)
    if pool.models_dir is None:
        raise ApiError(400, "downloads need a models directory; start the server with --models-dir")
    downloads = state.extras.get("webui.downloads")
    if downloads is None:
        downloads = Downloads(pool.models_dir, lambda path: pool.refresh())
        pool.on_close.append(downloads.close)
        state.extras["webui.downloads"] = downloads
    return downloads


async def _entry(request: Request) -> tuple[MultiModelPool, ModelEntry, Fields]:
    pool = _pool(request)
    f = Fields(await read_json(request))
    name = f.required("model")
    if not isinstance(name, str):
        raise ApiError(400, "'model' must be a model name (see GET /api/models)", "model")
    return pool, pool.entry(name), f


async def _summary(pool: MultiModelPool, entry: ModelEntry) -> JSONResponse:
    return JSONResponse(await asyncio.to_thread(pool.summary, entry))


async def list_models(request: Request) -> Any:
    """Every model with its file facts, state and flags; the downloads; the limits."""
    state = _state(request)
    pool = state.pool
    if not isinstance(pool, MultiModelPool):
        served = pool.served()
        rows = [
            {
                "name": m.name,
                "path": m.path,
                "arch": m.model.arch.names[0] if m.model.arch.names else "",
                "n_ctx": m.engine.ctx.n_ctx,
                "n_ctx_train": m.model.n_ctx_train,
                "state": "loaded",
            }
            for m in served
        ]
        return JSONResponse({"manageable": False, "models": rows, "downloads": []})
    entries = pool.entries()
    rows = await asyncio.to_thread(lambda: [pool.summary(e) for e in entries])
    downloads = state.extras.get("webui.downloads")
    return JSONResponse(
        {
            "manageable": True,
            "models_dir": str(pool.models_dir or ""),
            "models_max": pool.models_max,
            "models": rows,
            "downloads": [d.as_json() for d in downloads.list()] if downloads else [],
        }
    )


async def model_info(request: Request) -> Any:
    """One model's row (as ``/api/models`` lists it) with the metadata of its file."""
    name = request.path_params["name"]
    pool = _state(request).pool
    if isinstance(pool, MultiModelPool):
        entry = pool.entry(name)
        row = await asyncio.to_thread(pool.summary, entry)
        path = Path(entry.path)
    else:
        served = next((m for m in pool.served() if m.name == name), None)
        if served is None:
            raise ApiError(
                404,
                f"model '{name}' is not served here; see GET /api/models",
                code="model_not_found",
            )
        row, path = {"name": served.name, "path": served.path, "state": "loaded"}, Path(served.path)
    return JSONResponse({**row, **await asyncio.to_thread(model_details, path)})


async def load(request: Request) -> Any:
    pool, entry, _ = await _entry(request)
    # counts as a use (the model becomes most recently used); loads even without autoload
    await pool.acquire(entry.name, autoload=True)
    return await _summary(pool, entry)


async def unload(request: Request) -> Any:
    pool, entry, _ = await _entry(request)
    await pool.unload(entry)
    return await _summary(pool, entry)


async def delete(request: Request) -> Any:
    pool, entry, f = await _entry(request)
    await pool.delete(entry, force=f.boolean("force", False))
    return JSONResponse({"deleted": entry.name})


async def _flag(request: Request, kind: str) -> Any:
    pool, entry, f = await _entry(request)
    pool.flags.set(kind, entry.name, f.boolean(kind, True))
    return await _summary(pool, entry)


async def hide(request: Request) -> Any:
    return await _flag(request, "hidden")


async def favourite(request: Request) -> Any:
    return await _flag(request, "favourite")


async def list_downloads(request: Request) -> Any:
    return JSONResponse({"downloads": [d.as_json() for d in _downloads(request).list()]})


async def start_download(request: Request) -> Any:
    downloads = _downloads(request)
    f = Fields(await read_json(request))
    url = f.required("url")
    filename, sha256 = f.get("filename"), f.get("sha256")
    for name, value in (("url", url), ("filename", filename), ("sha256", sha256)):
        if value is not None and not isinstance(value, str):
            raise ApiError(400, f"'{name}' must be a string", name)
    return JSONResponse(downloads.start(url, filename or None, sha256 or None).as_json(), 202)


async def _download_action(request: Request, action: str) -> Any:
    downloads = _downloads(request)
    download_id = Fields(await read_json(request)).required("id")
    d = await asyncio.to_thread(getattr(downloads, action), str(download_id))
    return JSONResponse(d.as_json())


async def pause_download(request: Request) -> Any:
    return await _download_action(request, "pause")


async def resume_download(request: Request) -> Any:
    return await _download_action(request, "resume")


async def cancel_download(request: Request) -> Any:
    return await _download_action(request, "cancel")

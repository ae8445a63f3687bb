"""llama-server's router routes over a pool of models (``--models-dir`` or several ``-m``):
``POST /models/load`` and ``POST /models/unload`` (``{"model": ...}`` -> ``{"success":
true}``) and the router's own ``GET /props`` (no ``?model=``). Errors have llama-server's
shape (:func:`tessera.plugins.server.native_format.native_error_body`)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError
from tessera.plugins.server.model_pool import ModelEntry, MultiModelPool
from tessera.plugins.server.state import ServerState

from .api_fields_native import ROUTER_MODEL
from .fields import Fields, read_json
from .native_completion import native_errors


def router_pool(state: ServerState) -> MultiModelPool | None:
    """The pool when the server is a router (it serves several models), else None."""
    return state.pool if isinstance(state.pool, MultiModelPool) else None


async def _named(request: Request) -> tuple[MultiModelPool, ModelEntry]:
    pool = router_pool(request.app.state.tessera)
    if pool is None:
        raise ApiError(
            400,
            "this server serves one model (-m); start it with --models-dir DIR (or several -m) "
            "to load and unload models",
        )
    f = Fields(await read_json(request), ROUTER_MODEL)
    return pool, pool.entry(f["model"])


@native_errors
async def models_load(request: Request) -> Any:
    """Start loading a model (as llama-server, the answer does not wait for the load:
    ``GET /models`` shows it ``loading``, then ``loaded`` or failed)."""
    pool, entry = await _named(request)
    if entry.served is not None or entry.loading is not None:
        raise ApiError(400, f"model '{entry.name}' is already {entry.state}", "model")
    pool.begin_load(entry)
    return JSONResponse({"success": True})


@native_errors
async def models_unload(request: Request) -> Any:
    """Unload a loaded model; 409 while it loads or answers requests."""
    pool, entry = await _named(request)
    if entry.served is None and entry.loading is None:
        raise ApiError(400, f"model '{entry.name}' is not loaded", "model")
    await pool.unload(entry)
    return JSONResponse({"success": True})


def router_props(pool: MultiModelPool) -> dict[str, Any]:
    """``GET /props`` of a router without ``?model=``: its own settings, not a model's."""
    from tessera import __version__

    return {
        "role": "router",
        "max_instances": pool.models_max,
        "models_autoload": pool.autoload,
        # placeholders where a model's props have these, as llama-server's router gives
        "model_alias": "tessera",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "build_info": f"tessera-{__version__}",
    }

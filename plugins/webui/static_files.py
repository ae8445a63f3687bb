"""The page and its script and style sheet, from the package's ``static`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse

from tessera.contract.routes import ApiError

STATIC = Path(__file__).parent / "static"
#: The only files served: a name from the URL never reaches the file system otherwise.
_ASSETS = {
    "app.js": "text/javascript",
    "chat.js": "text/javascript",
    "models.js": "text/javascript",
    "style.css": "text/css",
}
_NO_CACHE = {"Cache-Control": "no-cache"}


async def index(request: Request) -> Any:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_NO_CACHE)


async def asset(request: Request) -> Any:
    filename = request.path_params["filename"]
    if filename not in _ASSETS:
        raise ApiError(404, f"no web UI file {filename!r}")
    return FileResponse(STATIC / filename, media_type=_ASSETS[filename], headers=_NO_CACHE)

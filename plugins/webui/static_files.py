"""The page and its scripts, style sheets, icon and vendored libraries, from the
package's ``static`` folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse

from tessera.contract.routes import ApiError

STATIC = Path(__file__).parent / "static"
_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
#: The only files served, by their path under ``static``: a name from the URL is looked
#: up here and never reaches the file system otherwise.
_ASSETS = {
    path.relative_to(STATIC).as_posix(): _MEDIA_TYPES[path.suffix]
    for path in STATIC.rglob("*")
    if path.is_file() and path.suffix in _MEDIA_TYPES
}
_NO_CACHE = {"Cache-Control": "no-cache"}


async def index(request: Request) -> Any:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_NO_CACHE)


async def favicon(request: Request) -> Any:
    # browsers ask for /favicon.ico whatever the page links; the SVG answers it
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml", headers=_NO_CACHE)


async def asset(request: Request) -> Any:
    filename = request.path_params["filename"]
    if filename not in _ASSETS:
        raise ApiError(404, f"no web UI file {filename!r}")
    return FileResponse(STATIC / filename, media_type=_ASSETS[filename], headers=_NO_CACHE)

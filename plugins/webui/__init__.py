"""The web UI of ``tessera serve``: a chat page and a Models Manager at ``/``, and the
JSON API the manager uses (``/api/models``, ``/api/downloads``).

This entry module stays light: the handlers load only when a route is first called.
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.contract.routes import ServerRoute, lazy_routes
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


#: (path, module, handler, methods, public): the page and its files are public (they
#: hold no data); the API needs the key.
_ROUTES = [
    ("/", "static_files", "index", ("GET",), True),
    ("/favicon.ico", "static_files", "favicon", ("GET",), True),
    ("/ui/{filename:path}", "static_files", "asset", ("GET",), True),
    ("/api/models", "api", "list_models", ("GET",), False),
    ("/api/models/load", "api", "load", ("POST",), False),
    ("/api/models/unload", "api", "unload", ("POST",), False),
    ("/api/models/delete", "api", "delete", ("POST",), False),
    ("/api/models/hide", "api", "hide", ("POST",), False),
    ("/api/models/favourite", "api", "favourite", ("POST",), False),
    ("/api/models/{name}", "api", "model_info", ("GET",), False),
    ("/api/downloads", "api", "list_downloads", ("GET",), False),
    ("/api/downloads", "api", "start_download", ("POST",), False),
    ("/api/downloads/pause", "api", "pause_download", ("POST",), False),
    ("/api/downloads/resume", "api", "resume_download", ("POST",), False),
    ("/api/downloads/cancel", "api", "cancel_download", ("POST",), False),
]


@hookimpl
def tessera_register_routes(register: Callable[[ServerRoute], None]) -> None:
    for route in lazy_routes(__name__, _ROUTES, prefix="webui."):
        register(route)

"""llama-server's /lora-adapters: the LoRA adapters the server has loaded, and their scales.

tessera loads no LoRA adapter (it has no ``--lora``), so the list is empty, as
llama-server's is when started without one. Setting the scales takes llama-server's body,
a list of ``{"id", "scale"}``: the empty list is accepted; an entry is refused (400, in
llama-server's error shape), because it names an adapter that is not loaded, where
llama-server would drop it silently.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError

from .native_completion import native_errors
from .native_inputs import refuse_lora


async def lora_adapters(request: Request) -> Any:
    """GET /lora-adapters: ``[]``, the adapters loaded (none)."""
    return JSONResponse([])


@native_errors
async def set_lora_adapters(request: Request) -> Any:
    """POST /lora-adapters: ``{"success": true}`` for an empty list; an entry is a 400 naming
    its adapter id, since none is loaded."""
    try:
        body = json.loads(await request.body())
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, list):  # null too: refuse_lora takes it for "not given"
        raise ApiError(400, 'the request body must be an array of {"id", "scale"} objects')
    refuse_lora(body, "the request body")
    return JSONResponse({"success": True})

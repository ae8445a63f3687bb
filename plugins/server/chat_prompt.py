"""The chat prompt without a completion: POST /apply-template (the rendered prompt) and
/chat/completions/input_tokens (its token count), as llama-server has them.

Both take a chat completion's body (every field of it is checked) and render exactly the
prompt ``/v1/chat/completions`` would evaluate.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.plugins.server.state import ServerState

from .api_fields import CHAT
from .chat_completions import chat_session, prompt_tokens
from .fields import Fields, read_json


async def _rendered(request: Request) -> tuple[Any, str]:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), CHAT)
    served = await state.model_for(request, f["model"])
    return served, chat_session(served, f).prompt()


async def apply_template(request: Request) -> Any:
    """``{"prompt": <the messages rendered by the chat template>}``."""
    _, prompt = await _rendered(request)
    return JSONResponse({"prompt": prompt})


async def chat_input_tokens(request: Request) -> Any:
    """``{"object": "response.input_tokens", "input_tokens": N}``: the prompt tokens the
    chat completion of this body would evaluate (its ``usage.prompt_tokens``)."""
    served, prompt = await _rendered(request)
    n_tokens = len(prompt_tokens(served, prompt))
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n_tokens})

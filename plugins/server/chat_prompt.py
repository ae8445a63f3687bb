"""The chat prompt without a completion: POST /apply-template (the rendered prompt) and
/chat/completions/input_tokens (its token count), as llama-server has them.

Both take a chat completion's body, checked as ``/v1/chat/completions`` checks it (a body
it refuses is refused here, with the same 400), and render exactly the prompt it would
evaluate.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from .chat_completions import chat_request


async def apply_template(request: Request) -> Any:
    """``{"prompt": <the messages rendered by the chat template>}``."""
    chat = await chat_request(request)
    return JSONResponse({"prompt": chat.prompt})


async def chat_input_tokens(request: Request) -> Any:
    """``{"object": "response.input_tokens", "input_tokens": N}``: the prompt tokens the
    chat completion of this body would evaluate (its ``usage.prompt_tokens``)."""
    chat = await chat_request(request)
    n_tokens = len(chat.requests[0].prompt)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n_tokens})

"""POST /embedding and /embeddings: llama-server's native embedding API.

The answer is a list, one ``{"index", "embedding"}`` per input, where ``embedding`` is a
list of vectors: the pooled one, normalized (``embd_normalize``, default
``--embd-normalize``), or, when the pooling is ``none`` (the model's or ``--pooling``),
one unnormalized vector per input token, as llama-server gives them. ``content`` is the
text (or texts), ``input`` its OpenAI name; prompts take the forms of ``/completion``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError
from tessera.errors import TesseraError
from tessera.plugins.server.state import ServerState

from .access_log import count_tokens
from .api_fields_native import NATIVE_EMBEDDING
from .embeddings import embedder_of
from .fields import Fields, read_json
from .native_completion import native_errors
from .native_format import ExceedContextError
from .native_inputs import native_prompts


def _vectors(embedder: Any, inputs: list[list[int]], normalize: int) -> list[np.ndarray]:
    """Each input's vectors: a (1, n_embd) pooled row or (n_tokens, n_embd) raw rows."""
    if embedder.pooling == "none":
        return [embedder.token_embeddings(t, normalize=-1) for t in inputs]
    return list(embedder.embed(inputs, normalize=normalize)[:, None, :])


@native_errors
async def native_embedding(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), NATIVE_EMBEDDING)
    served = await state.model_for(request, f["model"])
    # each one given is checked; "input" wins, as in llama-server
    given = {
        name: native_prompts(served.tokenizer, f[name], name)
        for name in ("input", "content")
        if f[name] is not None
    }
    if not given:
        raise ApiError(400, "'content' (or 'input') must be given: the text to embed", "content")
    inputs = given.get("input", given.get("content"))
    if any(not t for t in inputs):
        raise ApiError(400, "an input has no tokens; send at least one token of text", "content")
    normalize = f["embd_normalize"]
    normalize = served.settings.embd_normalize if normalize is None else normalize
    embedder = embedder_of(served)
    longest = max(len(t) for t in inputs)
    if longest > embedder.n_ctx:
        raise ExceedContextError(
            f"an input has {longest} tokens but the embedding context holds "
            f"{embedder.n_ctx}; shorten it or raise -c",
            longest,
            embedder.n_ctx,
            "content",
        )
    try:
        vectors = await asyncio.to_thread(_vectors, embedder, inputs, normalize)
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None
    count_tokens(sum(len(t) for t in inputs))
    return JSONResponse(
        [{"index": i, "embedding": v.astype("<f4").tolist()} for i, v in enumerate(vectors)]
    )

"""POST /v1/embeddings and /v1/rerank (/reranking) over :class:`tessera.engine.embed.Embedder`.

The embedder has its own context, so these requests never touch the slots or their
prompt cache.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError
from tessera.errors import ContextOverflowError, TesseraError
from tessera.plugins.server.state import ServedModel, ServerState

from .access_log import count_tokens
from .api_fields import EMBEDDINGS, RERANK
from .fields import Fields, read_json, token_ids


def embedder_of(served: ServedModel) -> Any:
    """The served model's embedding engine, made on first use (501 if it cannot be)."""
    try:
        from tessera.engine.embed import Embedder
    except ImportError:
        raise ApiError(501, "this build of tessera has no embedding engine") from None
    if served.embedder is None:
        try:
            settings = served.settings
            served.embedder = Embedder(
                served.model, pooling=settings.pooling, normalize=settings.embd_normalize
            )
        except TesseraError as exc:
            raise ApiError(501, f"embeddings are not available for this model: {exc}") from None
    return served.embedder


def _inputs(served: ServedModel, value: Any) -> list[list[int]]:
    tok = served.tokenizer
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "'input' must be a string, token ids, or a non-empty list", "input")
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(tok.encode(item, add_special=True, parse_special=False))
            continue
        ids = token_ids(item, tok.n_vocab, "input")
        if ids is None:
            raise ApiError(400, "each input must be a string or a list of token ids", "input")
        out.append(ids)
    return out


async def embeddings(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), EMBEDDINGS)
    served = await state.model_for(request, f["model"])
    inputs = _inputs(served, f["input"])
    dims = f["dimensions"]
    encoding = f["encoding_format"]
    embedder = embedder_of(served)
    try:
        vectors = await asyncio.to_thread(embedder.embed, inputs, dims)
    except ContextOverflowError as exc:
        raise ApiError(400, str(exc), code="context_length_exceeded") from None
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None
    data = []
    for i, v in enumerate(vectors):
        emb: Any = v.astype("<f4").tolist()
        if encoding == "base64":
            emb = base64.b64encode(v.astype("<f4").tobytes()).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    n_tokens = sum(len(t) for t in inputs)
    count_tokens(n_tokens)
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": served.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }
    )


async def rerank(request: Request) -> Any:
    """Jina's form (``documents``: ``{model, object, usage, results}``) or, given
    ``texts``, TEI's (a bare list of ``{index, score}``), as llama-server answers both."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), RERANK)
    served = await state.model_for(request, f["model"])
    query = f["query"]
    tei = f["texts"] is not None
    for name in ("documents", "texts"):  # each one given is checked; texts win (TEI's form)
        value = f[name]
        if value is not None and not (
            isinstance(value, list) and value and all(isinstance(d, str) for d in value)
        ):
            raise ApiError(400, f"'{name}' must be a non-empty list of strings", name)
    documents = f["texts"] if tei else f["documents"]
    if documents is None:
        raise ApiError(400, "'documents' (or 'texts') must be given", "documents")
    top_n = f["top_n"] or len(documents)
    embedder = embedder_of(served)
    try:
        scores = await asyncio.to_thread(embedder.rerank, query, documents)
        n_tokens = sum(len(embedder.pair_tokens(query, d)[0]) for d in documents)
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None
    count_tokens(n_tokens)
    order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))[:top_n]
    if tei:
        results = [{"index": i, "score": float(scores[i])} for i in order]
        if f["return_text"]:
            for r in results:
                r["text"] = documents[r["index"]]
        return JSONResponse(results)
    results = [{"index": i, "relevance_score": float(scores[i])} for i in order]
    if f["return_documents"]:
        for r in results:
            r["document"] = {"text": documents[r["index"]]}
    return JSONResponse(
        {
            "model": served.name,
            "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results,
        }
    )

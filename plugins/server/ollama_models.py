"""Ollama's model and embedding routes: GET /api/tags, /api/ps, /api/version, POST
/api/show, /api/embed and the older /api/embeddings, in Ollama's field names."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tessera.contract.routes import ApiError
from tessera.errors import ContextOverflowError, TesseraError
from tessera.plugins.server.state import ServedModel, ServerState

from .access_log import count_tokens
from .api_fields_ollama import OLLAMA_EMBED, OLLAMA_EMBEDDINGS, OLLAMA_SHOW
from .embeddings import embedder_of
from .fields import Fields, read_json
from .ollama import ollama_errors


def _size_units(n: int) -> str:
    """A parameter count as Ollama writes it (``5.5M``, ``494.0M``, ``7.6B``)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def _file_facts(path: str) -> tuple[int, str]:
    """The model file's size and modification time (0 and now for a built-in model)."""
    try:
        st = os.stat(path)
        return st.st_size, datetime.fromtimestamp(st.st_mtime, UTC).isoformat()
    except OSError:
        return 0, datetime.now(UTC).isoformat()


def details(served: ServedModel) -> dict[str, Any]:
    """Ollama's ``details``: format, family, parameter size, the most common tensor type."""
    from tessera.plugins.cmd.model_summary import parameter_count

    model = served.model
    family = model.arch.names[0] if model.arch.names else ""
    types = Counter(getattr(model, "tensor_types", {}).values()).most_common(1)
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family],
        "parameter_size": _size_units(parameter_count(model)),
        "quantization_level": str(types[0][0]) if types else "",
    }


def _entry(served: ServedModel) -> dict[str, Any]:
    size, modified = _file_facts(served.path)
    return {
        "name": served.name,
        "model": served.name,
        "modified_at": modified,
        "size": size,
        "digest": served.model.identity,
        "details": details(served),
    }


@ollama_errors
async def ollama_tags(request: Request) -> Any:
    """The models served now (a multi-model server lists those it has loaded)."""
    state: ServerState = request.app.state.tessera
    return JSONResponse({"models": [_entry(m) for m in state.pool.served()]})


@ollama_errors
async def ollama_ps(request: Request) -> Any:
    """The models in memory: every one loaded stays until the server stops (no expiry)."""
    state: ServerState = request.app.state.tessera
    models = []
    for served in state.pool.served():
        entry = _entry(served)
        del entry["modified_at"]
        never = datetime.fromtimestamp(2**31 - 1, UTC).isoformat()
        n_ctx = served.engine.ctx.n_ctx
        models.append({**entry, "expires_at": never, "size_vram": 0, "context_length": n_ctx})
    return JSONResponse({"models": models})


@ollama_errors
async def ollama_version(request: Request) -> Any:
    from tessera import __version__

    return JSONResponse({"version": __version__})


def _scalar_metadata(served: ServedModel) -> dict[str, Any]:
    """GGUF metadata without its arrays (the vocabulary), as Ollama's ``model_info``."""
    return {
        k: v
        for k, v in served.model.metadata.items()
        if isinstance(v, str | int | float | bool) and k != "tokenizer.chat_template"
    }


@ollama_errors
async def ollama_show(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), OLLAMA_SHOW)
    served = await state.model_for(request, f["model"])
    _, modified = _file_facts(served.path)
    template = served.chat_template or served.model.metadata.get("tokenizer.chat_template", "")
    capabilities = ["completion"] if served.engine is not None else []
    if served.settings.pooling is not None or served.embedder is not None:
        capabilities.append("embedding")
    return JSONResponse(
        {
            "modelfile": "",
            "parameters": "",
            "template": template,
            "details": details(served),
            "model_info": _scalar_metadata(served),
            "capabilities": capabilities,
            "modified_at": modified,
        }
    )


async def _embed(served: ServedModel, texts: list[str], dims: int | None) -> tuple[list, int]:
    """Each text's vector (normalized as --embd-normalize says) and the tokens read."""
    tok = served.tokenizer
    inputs = [tok.encode(t, add_special=True, parse_special=False) for t in texts]
    embedder = embedder_of(served)
    try:
        vectors = await asyncio.to_thread(embedder.embed, inputs, dims)
    except ContextOverflowError as exc:
        # never truncated, whatever 'truncate' says: a cut input is a different text
        raise ApiError(400, str(exc), code="context_length_exceeded") from None
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None
    n_tokens = sum(len(t) for t in inputs)
    count_tokens(n_tokens)
    return [v.astype("<f4").tolist() for v in vectors], n_tokens


@ollama_errors
async def ollama_embed(request: Request) -> Any:
    """POST /api/embed: ``input`` (a string or a list) -> ``embeddings``."""
    state: ServerState = request.app.state.tessera
    started = time.perf_counter()
    f = Fields(await read_json(request), OLLAMA_EMBED)
    served = await state.model_for(request, f["model"])
    texts = f["input"]
    if not texts:
        raise ApiError(400, "'input' must be a string or a non-empty list of strings", "input")
    vectors, n_tokens = await _embed(served, texts, f["dimensions"])
    return JSONResponse(
        {
            "model": served.name,
            "embeddings": vectors,
            "total_duration": int((time.perf_counter() - started) * 1e9),
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }
    )


@ollama_errors
async def ollama_embeddings(request: Request) -> Any:
    """POST /api/embeddings (Ollama's older route): ``prompt`` -> ``embedding``."""
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), OLLAMA_EMBEDDINGS)
    served = await state.model_for(request, f["model"])
    vectors, _ = await _embed(served, [f["prompt"]], None)
    return JSONResponse({"embedding": vectors[0]})

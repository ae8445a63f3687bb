"""What /v1/completions and /v1/chat/completions share: sampling fields, the generation
request of each choice, logprob entries, and the SSE stream that interleaves choices."""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs

from tessera.contract.routes import ApiError
from tessera.engine.logprobs import chat_logprob_entry
from tessera.engine.sampling import SEED_LIMIT, SamplerParamError, SamplerParams
from tessera.engine.slot_types import GenerationRequest, TokenEvent
from tessera.plugins.server.state import ServedModel

from .constraint_request import constraint_factory
from .dry_breakers import with_dry_breakers
from .fields import Fields
from .generation import ChoiceRun, Piece, run_error


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def response_head(served: ServedModel, object_name: str, prefix: str) -> dict[str, Any]:
    return {
        "id": new_id(prefix),
        "object": object_name,
        "created": int(time.time()),
        "model": served.name,
        "system_fingerprint": f"tessera-{served.model.identity[:12]}",
    }


#: The request fields that are :class:`SamplerParams` settings (the token-form breakers
#: are made from dry_sequence_breakers with the model's vocabulary).
SAMPLER_FIELDS = tuple(a.name for a in attrs.fields(SamplerParams) if a.name != "dry_breakers")


def sampler_params(f: Fields, n: int, defaults: SamplerParams | None = None) -> list[SamplerParams]:
    """The sampler of each of ``n`` choices: ``defaults`` (the server's --temp, --top-k ...)
    with every sampling field the request gives, under OpenAI's and llama.cpp's names
    (seed -1 = random). Called before any work: a value out of its range is a 400 naming
    the field, never an error in the engine.

    The server keeps temperature to OpenAI's 0..2; the other ranges are
    :class:`SamplerParams`' own.
    """
    given = {n: f[n] for n in SAMPLER_FIELDS if n in f.declared and f.body.get(n) is not None}
    try:
        params = attrs.evolve(defaults or SamplerParams(), **given)
    except SamplerParamError as exc:
        raise ApiError(400, str(exc), param=exc.field) from None
    if params.seed is None:
        return [params] * n
    # each choice draws its own stream, reproducibly: choice i uses seed + i
    return [attrs.evolve(params, seed=(params.seed + i) % SEED_LIMIT) for i in range(n)]


def max_tokens(f: Fields, default: int) -> int:
    """max_completion_tokens, max_tokens or n_predict (-1: until the context is full), the
    first one given; each one given is checked."""
    given = [f["max_completion_tokens"], f["max_tokens"], f["n_predict"]]
    return next((v for v in given if v is not None), default)


def capped(n_predict: int, served: ServedModel) -> int:
    """``n_predict`` clamped by the server's --max-tokens-cap."""
    cap = served.settings.max_tokens_cap
    if cap >= 0 and (n_predict < 0 or n_predict > cap):
        return cap
    return n_predict


def checked_id_slot(f: Fields, served: ServedModel) -> int:
    """The request's ``id_slot``; 400 for a slot this server does not have."""
    n_slots = len(served.engine.slots)
    id_slot = f["id_slot"]
    if id_slot >= n_slots:
        raise ApiError(
            400,
            f"id_slot must be an integer between -1 and {n_slots - 1}, got {id_slot}",
            "id_slot",
        )
    return id_slot


async def generation_requests(
    f: Fields,
    served: ServedModel,
    prompt: Sequence[int],
    samplers: Sequence[SamplerParams],
    n_predict: int,
    logprobs: int,
    tool_call: Mapping[str, Any] | None = None,
) -> list[GenerationRequest]:
    """One request per choice (one sampler each), ``n_predict`` capped by the server;
    ``tool_call`` is the spec of a forced tool call (see
    :func:`tessera.plugins.server.constraint_request.forced_tool_call`)."""
    id_slot = checked_id_slot(f, served)
    cache_prompt = f["cache_prompt"]
    ignore_eos = f["ignore_eos"]
    bias = logit_bias(f, served)
    constraint = await constraint_factory(f, served, tool_call)
    samplers = await with_dry_breakers(samplers, served)
    return [
        GenerationRequest(
            prompt=prompt,
            max_tokens=capped(n_predict, served),
            sampler=sampler,
            logprobs=logprobs if logprobs >= 0 else None,
            id_slot=id_slot if len(samplers) == 1 else -1,
            cache_prompt=cache_prompt,
            constraint=constraint,
            ignore_eos=ignore_eos,
            logit_bias=bias,
        )
        for sampler in samplers
    ]


def logit_bias(f: Fields, served: ServedModel) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: ``{"token id": bias in [-100, 100]}``."""
    value = f["logit_bias"] or {}
    n_vocab = served.tokenizer.n_vocab
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            token = -1
        if (
            not 0 <= token < n_vocab
            or isinstance(bias, bool)
            or not isinstance(bias, int | float)
            or (isinstance(bias, float) and not math.isfinite(bias))
        ):
            raise ApiError(
                400,
                f"logit_bias must map token ids in [0, {n_vocab}) to finite numbers; got {key!r}: "
                f"{bias!r}",
                "logit_bias",
            )
        out.append((token, float(max(-100, min(100, bias)))))  # clamped first: a huge int
    return tuple(out)


def logprob_entry(served: ServedModel, event: TokenEvent) -> dict[str, Any]:
    """One chat ``logprobs.content`` entry (token text, logprob, bytes, alternatives)."""
    return chat_logprob_entry(served.tokenizer, event)


def sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def interleave(
    runs: Sequence[ChoiceRun],
    on_piece: Callable[[int, Piece], list[dict]],
    on_end: Callable[[int], list[dict]],
    tail: Callable[[], list[dict]],
    *,
    done: bytes = b"data: [DONE]\n\n",
    error_body: Callable[[ApiError], dict] = ApiError.body,
) -> AsyncIterator[bytes]:
    """The SSE stream of several choices: their chunks in the order they come, then
    ``tail()`` (usage) and ``done`` (OpenAI's ``[DONE]``; llama-server's native stream ends
    without one). Leaving early (a disconnect) cancels every choice."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, run: ChoiceRun) -> None:
        try:
            async for piece in run.pieces():
                await queue.put((i, piece))
        finally:
            await queue.put((i, None))

    pumps = [asyncio.create_task(pump(i, r)) for i, r in enumerate(runs)]
    try:
        remaining = len(runs)
        while remaining:
            i, piece = await queue.get()
            if piece is None:
                remaining -= 1
                run = runs[i]
                if (error := run_error(run)) is not None:
                    yield sse(error_body(error))
                    continue
                for chunk in on_end(i):
                    yield sse(chunk)
            else:
                for chunk in on_piece(i, piece):
                    yield sse(chunk)
        for chunk in tail():
            yield sse(chunk)
        if done:
            yield done
    finally:
        for p in pumps:
            p.cancel()
        for r in runs:
            r.cancel()


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

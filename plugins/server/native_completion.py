"""POST /completion and /completions: llama-server's native completion API.

As in llama-server, ``/completions`` is this route too (only ``/v1/completions`` is
OpenAI's). A request with several prompts (or ``n_cmpl`` > 1) is answered with a list;
a stream sends one ``data:`` chunk per token and a last chunk with ``stop: true``, with no
``[DONE]``. Errors have llama-server's shape (:func:`native_error_body`). ``/infill``
runs through :func:`run_native` with the prompt it lays out.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tessera.contract.routes import ApiError
from tessera.engine.slot_types import GenerationRequest
from tessera.plugins.server.state import ServedModel, ServerState

from .api_fields_native import NATIVE_COMPLETION
from .constraint_request import constraint_factory
from .dry_breakers import with_dry_breakers
from .fields import Fields, read_json
from .generation import ChoiceRun, Piece, run_all, start_runs
from .native_format import (
    ExceedContextError,
    NativeOptions,
    final_result,
    generation_settings,
    native_error_body,
    partial_chunk,
)
from .native_inputs import native_logit_bias, native_prompts, refuse_lora
from .openai_common import SSE_HEADERS, capped, checked_id_slot, interleave, sampler_params


def native_errors(
    handler: Callable[[Request], Awaitable[Any]],
) -> Callable[[Request], Awaitable[Any]]:
    """Answer the handler's refusals in llama-server's error shape."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Any:
        try:
            return await handler(request)
        except ApiError as exc:
            return JSONResponse(native_error_body(exc), status_code=exc.status)

    return endpoint


def requested_n_predict(f: Fields, default: int = -1) -> int:
    """``n_predict``, else its other name ``max_tokens``, else ``default`` (the server's
    -n, or -1); both are checked."""
    n_predict, max_tokens = f["n_predict"], f["max_tokens"]
    if f.body.get("n_predict") is not None:
        return n_predict
    return max_tokens if max_tokens is not None else default


def _response_fields(f: Fields) -> tuple[str, ...]:
    value = f["response_fields"] or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ApiError(400, "'response_fields' must be a list of field names", "response_fields")
    return tuple(value)


async def run_native(
    request: Request, f: Fields, served: ServedModel, prompts: Sequence[Sequence[int]]
) -> Any:
    """Run ``prompts`` (``n_cmpl`` times each) and answer as llama-server does."""
    refuse_lora(f["lora"], "'lora'", "lora")
    constraint = await constraint_factory(f, served)
    n_cmpl, n_probs, stream = f["n_cmpl"], f["n_probs"], f["stream"]
    n_predict = requested_n_predict(f, served.settings.default_n_predict(-1))
    samplers = await with_dry_breakers(sampler_params(f, n_cmpl, served.settings.sampler), served)
    bias = native_logit_bias(served.tokenizer, f["logit_bias"])
    id_slot = checked_id_slot(f, served)
    stops = f["stop"]
    max_tokens = capped(1 if n_predict == 0 else n_predict, served)
    requests = [
        GenerationRequest(
            prompt=prompt,
            max_tokens=max_tokens,
            sampler=sampler,
            logprobs=n_probs if n_probs > 0 else None,
            id_slot=id_slot if len(prompts) * n_cmpl == 1 else -1,
            cache_prompt=f["cache_prompt"],
            ignore_eos=f["ignore_eos"],
            logit_bias=bias,
            report_progress=stream and f["return_progress"],
            constraint=constraint,
        )
        for prompt in prompts
        for sampler in samplers
    ]
    settings = generation_settings(
        samplers[0],
        n_predict=n_predict,
        stop=stops,
        stream=stream,
        n_probs=n_probs,
        ignore_eos=f["ignore_eos"],
        logit_bias=bias,
        cache_prompt=f["cache_prompt"],
    )
    opt = NativeOptions(
        settings,
        stream,
        n_probs,
        f["return_tokens"],
        prompt_only=n_predict == 0,
        max_tokens=max_tokens,
        response_fields=_response_fields(f),
    )
    try:
        runs = start_runs(served, requests, stops)
    except ApiError as exc:
        if exc.code != "context_length_exceeded":
            raise
        n_ctx = served.engine.ctx.n_ctx
        longest = max(len(p) for p in prompts)
        raise ExceedContextError(exc.message, longest, n_ctx) from None
    prompt_of = [req.prompt for req in requests]
    if stream:
        return StreamingResponse(
            _stream(served, runs, prompt_of, opt),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    await run_all(request, runs)
    tok = served.tokenizer
    results = [
        final_result(tok, served.name, run, i, prompt_of[i], opt) for i, run in enumerate(runs)
    ]
    return JSONResponse(results[0] if len(results) == 1 else results)


def _stream(
    served: ServedModel, runs: list[ChoiceRun], prompts: list[Sequence[int]], opt: NativeOptions
):
    tok = served.tokenizer
    held = [""] * len(runs)  # text released only at the end (no token of its own)
    n_sent = [0] * len(runs)  # tokens sent so far (the runs read ahead of the stream)

    def on_piece(i: int, piece: Piece) -> list[dict]:
        if piece.token is None and piece.progress is None:
            held[i] += piece.text
            return []
        if opt.prompt_only and piece.progress is None:
            return []
        n_sent[i] += piece.token is not None
        run = runs[i]
        return [
            partial_chunk(
                tok, i, piece.text, piece.token, n_sent[i], len(prompts[i]), run.task.id_slot,
                opt, piece.progress,
            )
        ]  # fmt: skip

    def on_end(i: int) -> list[dict]:
        return [final_result(tok, served.name, runs[i], i, prompts[i], opt, held[i])]

    return interleave(runs, on_piece, on_end, lambda: [], done=b"", error_body=native_error_body)


@native_errors
async def native_completion(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), NATIVE_COMPLETION)
    served = await state.model_for(request, f["model"])
    return await run_native(request, f, served, native_prompts(served.tokenizer, f["prompt"]))

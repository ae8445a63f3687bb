"""POST /v1/completions: OpenAI's legacy text completions (prompt in, text out)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from tessera.contract.routes import ApiError
from tessera.engine.logprobs import completion_logprobs
from tessera.plugins.server.state import ServedModel, ServerState

from .api_fields import COMPLETIONS
from .fields import Fields, read_json, token_ids
from .generation import ChoiceRun, Piece, run_all, start_runs, timings, usage
from .openai_common import (
    SSE_HEADERS,
    generation_requests,
    interleave,
    max_tokens,
    response_head,
    sampler_params,
)


def prompts_of(served: ServedModel, prompt: Any) -> list[list[int]]:
    """OpenAI's prompt forms: a string, token ids, or a list of either."""
    tok = served.tokenizer

    def one(p: Any) -> list[int]:
        if isinstance(p, str):
            return tok.encode(p, add_special=True, parse_special=True)
        ids = token_ids(p, tok.n_vocab, "prompt")
        if ids is None:
            raise ApiError(400, "'prompt' must be a string, token ids, or a list of them", "prompt")
        return ids

    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        return [one(p) for p in prompt]
    return [one(prompt)]


def echoes(served: ServedModel, f: Fields, prompts: list[list[int]]) -> list[str]:
    """The text ``echo`` puts before each prompt's completions ("" each without echo): a
    prompt string as it was sent, token ids as text."""
    if not f["echo"]:
        return [""] * len(prompts)
    if f["logprobs"] is not None:
        raise ApiError(
            400,
            "echo with logprobs would need the prompt tokens' log-probabilities, which this "
            "server does not compute; ask for echo or logprobs, not both",
            "echo",
        )
    given = f["prompt"]
    texts = given if isinstance(given, list) and len(given) == len(prompts) else [given]
    tok = served.tokenizer
    pairs = zip(texts, prompts, strict=True)
    return [t if isinstance(t, str) else tok.decode(ids) for t, ids in pairs]


def _logprobs(served: ServedModel, run: ChoiceRun, offset: int = 0) -> dict[str, Any]:
    """The legacy ``logprobs`` object: tokens, their logprobs, top alternatives, offsets."""
    return completion_logprobs(served.tokenizer, run.tokens, offset)


async def completions(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), COMPLETIONS)
    n = f["n"]
    logprobs = f["logprobs"]
    n_predict = max_tokens(f, default=state.settings.default_n_predict(16))
    samplers = sampler_params(f, n, state.settings.sampler)
    stream = f["stream"]
    served = await state.model_for(request, f["model"])
    prompts = prompts_of(served, f["prompt"])
    echo = [text for text in echoes(served, f, prompts) for _ in range(n)]  # one per run
    n_top = -1 if logprobs is None else logprobs
    requests = [
        req
        for p in prompts
        for req in await generation_requests(f, served, p, samplers, n_predict, n_top)
    ]
    runs = start_runs(served, requests, f["stop"])
    head = response_head(served, "text_completion", "cmpl")
    if stream:
        include_usage = bool((f["stream_options"] or {}).get("include_usage"))

        def echoed(i: int, text: str) -> str:
            """The echo goes with a choice's first chunk."""
            first, echo[i] = echo[i], ""
            return first + text

        def on_piece(i: int, piece: Piece) -> list[dict]:
            text = echoed(i, piece.text)
            if not text:
                return []
            choice = {"index": i, "text": text, "logprobs": None, "finish_reason": None}
            return [{**head, "choices": [choice]}]

        def on_end(i: int) -> list[dict]:
            reason = runs[i].finish_reason
            choice = {"index": i, "text": echoed(i, ""), "logprobs": None, "finish_reason": reason}
            return [{**head, "choices": [choice]}]

        def tail() -> list[dict]:
            return [{**head, "choices": [], "usage": _usage(runs, n)}] if include_usage else []

        return StreamingResponse(
            interleave(runs, on_piece, on_end, tail),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    await run_all(request, runs)
    choices = [
        {
            "index": i,
            "text": echo[i] + r.text,
            "logprobs": None if logprobs is None else _logprobs(served, r),
            "finish_reason": r.finish_reason,
        }
        for i, r in enumerate(runs)
    ]
    return JSONResponse(
        {**head, "choices": choices, "usage": _usage(runs, n), "timings": timings(runs)}
    )


def _usage(runs: list[ChoiceRun], n: int) -> dict[str, Any]:
    """Usage summed over prompts (each prompt counted once, whatever n)."""
    per_prompt = [usage(runs[i : i + n]) for i in range(0, len(runs), n)]
    total = {k: sum(u[k] for u in per_prompt) for k in ("prompt_tokens", "completion_tokens")}
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    total["prompt_tokens_details"] = {
        "cached_tokens": sum(u["prompt_tokens_details"]["cached_tokens"] for u in per_prompt)
    }
    return total

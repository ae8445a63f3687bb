"""The JSON of llama-server's native completion API: the final result, the stream's
chunks, ``completion_probabilities``, ``generation_settings`` and its error shape.

Field names and meanings are llama-server's (tools/server/README.md and its tests): the
final result has ``content``, ``tokens``, ``stop: true``, ``stop_type`` (``eos``, ``limit``,
``word``, ``none``), ``stopping_word``, ``timings``, ``generation_settings``,
``tokens_cached``, ``tokens_evaluated``, ``truncated`` ...; a stream chunk has ``content``,
``tokens`` (the token it carries), ``stop: false``. Errors are
``{"error": {"code": <HTTP status>, "message", "type"}}``; a prompt too long for the
context is ``exceed_context_size_error`` with ``n_prompt_tokens`` and ``n_ctx``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from tessera.contract.routes import ApiError, error_type
from tessera.engine.progress import PromptProgress
from tessera.engine.sampling import SamplerParams
from tessera.engine.slot_types import TokenEvent

from .generation import ChoiceRun, finish_timings

#: the seed llama-server reports for a random one: -1 as a uint32 (its LLAMA_DEFAULT_SEED)
RANDOM_SEED = 0xFFFFFFFF
#: The sampler chain in llama-server's names, in the order tessera applies it.
SAMPLERS = (
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"
)  # fmt: skip


class ExceedContextError(ApiError):
    """A prompt that does not fit the context (llama-server's exceed_context_size_error)."""

    def __init__(
        self, message: str, n_prompt_tokens: int, n_ctx: int, param: str = "prompt"
    ) -> None:
        super().__init__(400, message, param)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


def native_error_body(error: ApiError) -> dict[str, Any]:
    """llama-server's error object: the HTTP status as ``code`` (``param`` kept beside)."""
    body = {
        "code": error.status,
        "message": error.message,
        "type": error_type(error.status),
        "param": error.param,
    }
    if isinstance(error, ExceedContextError):
        body.update(
            type="exceed_context_size_error",
            n_prompt_tokens=error.n_prompt_tokens,
            n_ctx=error.n_ctx,
        )
    return {"error": body}


@attrs.frozen
class NativeOptions:
    """What a native completion request asked for, beyond its generation requests."""

    settings: dict[str, Any]
    stream: bool = False
    n_probs: int = 0
    return_tokens: bool = False
    #: n_predict 0: the prompt is read, the one token sampled from it is not reported.
    prompt_only: bool = False
    #: The request's max_tokens after the server's cap (-1: none).
    max_tokens: int = -1
    response_fields: tuple[str, ...] = ()


def generation_settings(
    sampler: SamplerParams,
    *,
    n_predict: int,
    stop: Sequence[str] = (),
    stream: bool = False,
    n_probs: int = 0,
    ignore_eos: bool = False,
    logit_bias: Sequence[tuple[int, float]] = (),
    cache_prompt: bool = True,
) -> dict[str, Any]:
    """llama-server's ``generation_settings`` for the settings tessera implements."""
    return {
        # llama-server reports a random seed (-1) as its uint32 LLAMA_DEFAULT_SEED
        "seed": RANDOM_SEED if sampler.seed is None else sampler.seed,
        "temperature": sampler.temperature,
        "top_k": sampler.top_k,
        "top_p": sampler.top_p,
        "min_p": sampler.min_p,
        "repeat_last_n": sampler.repeat_last_n,
        "repeat_penalty": sampler.repeat_penalty,
        "presence_penalty": sampler.presence_penalty,
        "frequency_penalty": sampler.frequency_penalty,
        "typical_p": sampler.typical_p,
        "top_n_sigma": sampler.top_n_sigma,
        "xtc_probability": sampler.xtc_probability,
        "xtc_threshold": sampler.xtc_threshold,
        "dry_multiplier": sampler.dry_multiplier,
        "dry_base": sampler.dry_base,
        "dry_allowed_length": sampler.dry_allowed_length,
        "dry_penalty_last_n": sampler.dry_penalty_last_n,
        "dry_sequence_breakers": list(sampler.dry_sequence_breakers),
        "stop": list(stop),
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "ignore_eos": ignore_eos,
        "stream": stream,
        # a banned token (bias false) is false again: JSON has no -Infinity
        "logit_bias": [{"bias": b if b > -1e30 else False, "token": t} for t, b in logit_bias],
        "n_probs": n_probs,
        "cache_prompt": cache_prompt,
        "samplers": list(SAMPLERS),
    }


def probs_entry(tok: Any, event: TokenEvent) -> dict[str, Any]:
    """One ``completion_probabilities`` entry: the token and its top alternatives."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = tok.token_to_bytes(token)
        text = raw.decode("utf-8", errors="ignore")  # an incomplete UTF-8 tail is cut
        return {"id": token, "token": text, "bytes": list(raw), "logprob": logprob}

    entry = one(event.token, event.logprob)
    entry["top_logprobs"] = [one(t, lp) for t, lp in event.top_logprobs]
    return entry


def stop_type(run: ChoiceRun) -> str:
    """Why the generation ended, in llama-server's words."""
    if run.stopping_word:
        return "word"
    reason = run.finish.reason if run.finish else None
    return {"stop": "eos", "length": "limit"}.get(reason, "none")


def pick_fields(result: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only these fields, ``a/b`` lifted from ``a``
    under the name ``a/b``; missing ones are left out."""
    out = {}
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


def final_result(
    tok: Any,
    model: str,
    run: ChoiceRun,
    index: int,
    prompt: Sequence[int],
    opt: NativeOptions,
    held_back: str = "",
) -> dict[str, Any]:
    """The last object of a completion: the whole answer, or in a stream the end with the
    text ``held_back`` until then (a stop string that never completed)."""
    f = run.finish
    kind = stop_type(run)
    # the tokens reported (a stop string's cancel may race one more through the engine)
    events = [] if opt.prompt_only else run.tokens
    timings = finish_timings(f)
    if opt.prompt_only:  # the one token sampled from the prompt is not part of the answer
        timings.update(predicted_n=0, predicted_per_token_ms=0.0, predicted_per_second=0.0)
    text = "" if opt.prompt_only else run.text
    result = {
        "index": index,
        # a stream has sent the text already; only what was held back comes here
        "content": held_back if opt.stream else text,
        "tokens": [e.token for e in events] if opt.return_tokens and not opt.stream else [],
        "id_slot": f.id_slot,
        "stop": True,
        "model": model,
        "tokens_predicted": len(events),
        "tokens_evaluated": f.n_prompt,
        "generation_settings": opt.settings,
        "prompt": tok.decode(prompt),
        "has_new_line": "\n" in text,
        # the context filled up before n_predict was reached
        "truncated": f.reason == "length" and not 0 <= opt.max_tokens <= f.n_generated,
        "stop_type": kind,
        "stopping_word": run.stopping_word,
        # what the slot's cache holds now: the last sampled token is never evaluated,
        # an end-of-generation token is not counted in n_generated
        "tokens_cached": f.n_prompt + f.n_generated - (kind != "eos" and f.n_generated > 0),
        "timings": timings,
    }
    if opt.n_probs > 0 and not opt.stream:
        kept = events
        if kind == "word":  # the stop string's own tokens are not part of the answer
            n_stop = len(tok.encode(run.stopping_word, add_special=False))
            kept = events[: max(len(events) - n_stop, 0)]
        result["completion_probabilities"] = [probs_entry(tok, e) for e in kept]
    return pick_fields(result, opt.response_fields) if opt.response_fields else result


def partial_chunk(
    tok: Any,
    index: int,
    text: str,
    event: TokenEvent | None,
    n_predicted: int,
    n_prompt: int,
    id_slot: int,
    opt: NativeOptions,
    progress: PromptProgress | None = None,
) -> dict[str, Any]:
    """One chunk of a stream: a token and its text, or the prompt's progress."""
    chunk: dict[str, Any] = {
        "index": index,
        "content": text,
        "tokens": [] if event is None else [event.token],
        "stop": False,
        "id_slot": id_slot,
        "tokens_predicted": n_predicted,
        "tokens_evaluated": n_prompt,
    }
    if progress is not None:
        chunk["prompt_progress"] = attrs.asdict(progress)
    if event is not None and opt.n_probs > 0:
        chunk["completion_probabilities"] = [probs_entry(tok, event)]
    return chunk

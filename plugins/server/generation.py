"""Running completions in the slot engine from async handlers: one :class:`ChoiceRun` per
choice, turning engine events into text pieces (stop strings applied) and usage numbers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
from starlette.requests import Request

from tessera.contract.routes import ApiError
from tessera.engine.progress import PromptProgress
from tessera.engine.slot_types import EngineBusyError, FinishEvent, GenerationRequest, TokenEvent
from tessera.errors import ContextOverflowError, TesseraError
from tessera.plugins.chat import StopStringMatcher
from tessera.plugins.server.state import ServedModel
from tessera.text.stream import StreamDecoder

from .access_log import count_tokens

#: engine finish reasons as OpenAI spells them ("cancelled" only happens on a stop string
#: here: a disconnected client gets no answer at all)
_FINISH = {"stop": "stop", "length": "length", "cancelled": "stop", "error": "error"}


@attrs.define
class Piece:
    """Text now safe to send, with the token that completed it (None for held-back text);
    or, with ``progress``, how far the prompt has been read (no text, no token)."""

    text: str
    token: TokenEvent | None
    progress: PromptProgress | None = None


class ContextExceededError(ApiError):
    """A prompt that does not fit the context: OpenAI's ``context_length_exceeded`` code
    with llama-server's ``exceed_context_size_error`` type, ``n_prompt_tokens`` and ``n_ctx``."""

    def __init__(self, message: str, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(400, message, code="context_length_exceeded")
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"].update(
            type="exceed_context_size_error", n_prompt_tokens=self.n_prompt_tokens, n_ctx=self.n_ctx
        )
        return body


class ChoiceRun:
    """One generation in the engine, read as pieces of text."""

    def __init__(
        self, served: ServedModel, request: GenerationRequest, stops: Sequence[str]
    ) -> None:
        loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._decoder = StreamDecoder(served.tokenizer)
        try:
            self._stops = StopStringMatcher(stops)
        except TesseraError as exc:
            raise ApiError(400, str(exc), param="stop") from None
        self.finish: FinishEvent | None = None
        self.finish_reason: str | None = None
        self.text = ""
        self.tokens: list[TokenEvent] = []
        try:
            self.task = served.engine.submit(
                request, lambda event: loop.call_soon_threadsafe(self._events.put_nowait, event)
            )
        except ContextOverflowError as exc:
            # the message names both token counts; the body carries them as numbers too
            n_ctx = served.engine.ctx.n_ctx
            raise ContextExceededError(str(exc), len(request.prompt), n_ctx) from None
        except EngineBusyError as exc:
            raise ApiError(503, str(exc)) from None
        except TesseraError as exc:
            raise ApiError(400, str(exc)) from None

    def cancel(self) -> None:
        self.task.cancel()

    @property
    def stopping_word(self) -> str:
        """The stop string that ended the text ("" if none did)."""
        return self._stops.stop or ""

    async def pieces(self) -> AsyncIterator[Piece]:
        """Pieces until the end; then :attr:`finish` and :attr:`finish_reason` are set."""
        stopped = False
        while True:
            event = await self._events.get()
            if isinstance(event, FinishEvent):
                self.finish = event
                count_tokens(event.n_prompt, event.n_generated)
                if not stopped:
                    self.finish_reason = _FINISH[event.reason]
                    tail = self._stops.feed(self._decoder.flush()).text + self._stops.flush()
                    if tail:
                        self.text += tail
                        yield Piece(tail, None)
                return
            if stopped:
                continue  # tokens that raced the cancel
            if isinstance(event, PromptProgress):
                yield Piece("", None, event)
                continue
            self.tokens.append(event)
            check = self._stops.feed(self._decoder.feed(event.token))
            self.text += check.text
            yield Piece(check.text, event)  # text may be "": held back, or a stop
            if check.stopped:
                stopped, self.finish_reason = True, "stop"
                self.task.cancel()

    async def run(self) -> str:
        """Read to the end; the whole text."""
        async for _ in self.pieces():
            pass
        return self.text


def start_runs(
    served: ServedModel, requests: Sequence[GenerationRequest], stops: Sequence[str]
) -> list[ChoiceRun]:
    """Submit every request; if one is refused, cancel those already queued."""
    served.check_generates()
    runs: list[ChoiceRun] = []
    try:
        for req in requests:
            runs.append(ChoiceRun(served, req, stops))
    except BaseException:
        for r in runs:
            r.cancel()
        raise
    return runs


def usage(runs: Sequence[ChoiceRun]) -> dict[str, Any]:
    """OpenAI ``usage``: the prompt counted once, completions summed over choices."""
    first = runs[0].finish
    completion = sum(r.finish.n_generated for r in runs if r.finish)
    return {
        "prompt_tokens": first.n_prompt,
        "completion_tokens": completion,
        "total_tokens": first.n_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": first.n_cached},
    }


def timings(runs: Sequence[ChoiceRun]) -> dict[str, Any]:
    """llama.cpp's ``timings`` extension: what the first choice evaluated and how fast."""
    return finish_timings(runs[0].finish)


def finish_timings(f: FinishEvent) -> dict[str, Any]:
    """llama.cpp's ``timings`` of one finished generation."""
    n_eval = f.n_prompt - f.n_cached
    return {
        "cache_n": f.n_cached,
        "prompt_n": n_eval,
        "prompt_ms": f.t_prompt_ms,
        "prompt_per_token_ms": f.t_prompt_ms / n_eval if n_eval else 0.0,
        "prompt_per_second": n_eval / f.t_prompt_ms * 1e3 if f.t_prompt_ms else 0.0,
        "predicted_n": f.n_generated,
        "predicted_ms": f.t_generate_ms,
        "predicted_per_token_ms": f.t_generate_ms / f.n_generated if f.n_generated else 0.0,
        "predicted_per_second": f.n_generated / f.t_generate_ms * 1e3 if f.t_generate_ms else 0.0,
    }


def run_error(run: ChoiceRun) -> ApiError | None:
    """What went wrong with a finished run, as the client should hear it: a failure (500),
    or a cut by the server (503: a shutdown's grace period ran out); None if nothing."""
    finish = run.finish
    if finish is None:
        return None
    if finish.reason == "error":
        return ApiError(500, finish.error or "generation failed")
    if finish.reason == "cancelled" and finish.error:
        return ApiError(503, finish.error, code="server_shutting_down")
    return None


def check_errors(runs: Sequence[ChoiceRun]) -> None:
    for r in runs:
        if (error := run_error(r)) is not None:
            raise error


async def cancel_on_disconnect(request: Request, runs: Sequence[ChoiceRun]) -> None:
    """Wait for the client to go away, then cancel ``runs`` (frees their slots at once)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for r in runs:
                r.cancel()
            return


async def run_all(request: Request, runs: Sequence[ChoiceRun]) -> None:
    """Run every choice to its end, cancelling them all if the client disconnects."""
    watcher = asyncio.create_task(cancel_on_disconnect(request, runs))
    try:
        await asyncio.gather(*(r.run() for r in runs))
    finally:
        watcher.cancel()
        for r in runs:
            r.cancel()  # no-op for finished ones; frees the slot if we were cancelled
    check_errors(runs)

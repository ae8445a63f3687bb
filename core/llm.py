"""``tessera.LLM``: a model in a Python program, answering as llama-cpp-python's ``Llama`` does.

One object loads the model (the bundled one when none is named), keeps one context and
generates through a :class:`~tessera.engine.cached_sequence.CachedSequence`, so a prompt
that starts like the previous one (the next turn of a chat) evaluates only what is new.
``complete`` and ``chat`` (also under llama-cpp-python's names) return OpenAI-shaped dicts
(:mod:`tessera.llm_responses`), or chunks with ``stream=True`` or from ``stream``; their
sampling keywords are checked and mapped onto the sampler chain by
:mod:`tessera.llm_sampling`. See docs/python-api.md. One generation runs at a time: a new
one closes a stream still open.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.engine.cached_sequence import CachedSequence
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import GenerationStats, check_prompt
from tessera.errors import TesseraError
from tessera.files.load import default_model_path, load_model
from tessera.llm_options import load_options
from tessera.llm_responses import Response, RunTotals, chat_chunks, completion_chunks
from tessera.llm_sampling import (
    CHAT_DEFAULTS,
    COMPLETE_DEFAULTS,
    AdjustedSampler,
    GenerationArgs,
    SamplingKeywords,
)
from tessera.llm_tools import offered_tools
from tessera.plugin_manager import PluginFailure, Runtime
from tessera.text.chat_prompt import encode_chat_prompt, model_chat_template
from tessera.text.stop_strings import StopStringMatcher
from tessera.text.stream import StreamDecoder


def _warn(failure: PluginFailure) -> None:
    warnings.warn(f"plugin '{failure.name}' skipped: {failure.error}", stacklevel=2)


def _check_messages(messages: Any) -> list[dict]:
    ok = isinstance(messages, list) and messages
    if not ok or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise TesseraError(
            "messages must be a non-empty list of dicts with a 'role' and a 'content', "
            'e.g. [{"role": "user", "content": "Hello"}]'
        )
    return messages


class LLM:
    """A loaded model with one context (see the module docstring).

    ``model``: a GGUF file, a Hugging Face folder or a packaged model's name (None: the
    bundled default model). ``backend``, ``device``, ``dtype`` and ``n_threads`` choose
    where it runs, as ``--backend --device --dtype -t`` do; ``pooling`` is the embedding
    pooling (default: the model's); ``chat_template`` replaces the model's template.
    Other keywords are :class:`~tessera.engine.context.ContextParams` fields (``n_ctx``
    0 or absent: the model's trained context, at most 4096) and llama-cpp-python's
    ``model_path``, ``seed``, ``verbose`` and ``n_gpu_layers`` (:mod:`tessera.llm_options`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        backend: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        n_threads: int | None = 0,
        pooling: str | None = None,
        chat_template: str | None = None,
        **options: Any,
    ) -> None:
        opts = load_options(model, device, options)
        runtime = Runtime(on_failure=_warn)
        self._keywords = SamplingKeywords(runtime)
        self._seeds = opts.seeds
        self.model = load_model(
            opts.model if opts.model is not None else default_model_path(),
            runtime,
            backend,
            progress=opts.progress,  # a bar on a terminal's stderr only (never in a notebook)
            device=device,
            dtype=dtype,
        )
        if n_threads and n_threads > 0:  # llama-cpp-python's None: the backend's default
            self.model.backend.set_threads(n_threads)
        context = dict(opts.context)
        n_ctx = int(context.pop("n_ctx", 0) or 0) or min(self.model.n_ctx_train, 4096)
        #: The context's settings (sizes, flash attention ...).
        self.context_params = ContextParams(n_ctx=n_ctx, **context)
        #: The name the responses carry in ``model`` (the file or folder name).
        self.model_name = Path(self.model.path).name
        self._pooling = pooling
        self._template_source = chat_template
        self._template: Any = None
        self._seq: CachedSequence | None = None
        self._embedder: Any = None
        self._active: Iterator[str] | None = None
        self._closed = False

    # -- the pieces, made when first needed ----------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TesseraError("this LLM is closed; make a new one")

    @property
    def tokenizer(self) -> Any:
        self._check_open()
        if self.model.tokenizer is None:
            raise TesseraError(f"'{self.model.path}' has no tokenizer; use a model with one")
        return self.model.tokenizer

    @property
    def n_ctx(self) -> int:
        return self.context_params.n_ctx

    def _sequence(self) -> CachedSequence:
        self._check_open()
        if self._seq is None:
            self._seq = CachedSequence(Context(self.model, self.context_params))
        return self._seq

    # -- tokens ----------------------------------------------------------------------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids of ``text`` (with the model's BOS when ``add_special``)."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of token ids."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special=skip_special)

    # -- generation ------------------------------------------------------------------------

    def complete(
        self, prompt: str | Sequence[int], *, stream: bool = False, **sampling: Any
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Continue ``prompt`` (text, or token ids); a ``text_completion`` dict, or with
        ``stream`` an iterator of its chunks. The sampling keywords are
        :mod:`tessera.llm_sampling`'s: ``max_tokens`` (default 16; None or 0: until the model
        ends or the context is full), ``temperature`` (default 0.8; 0: greedy), ``seed``
        (None: random), ``stop``, ``logit_bias``, ``grammar``, ``response_format`` and
        every setting of the sampler chain."""
        args = self._parse("complete", sampling, COMPLETE_DEFAULTS)
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        pieces, totals, response = self._generate("cmpl", tokens, args)
        if stream:
            return completion_chunks(response, pieces, totals)
        return response.completion("".join(pieces), totals)

    def chat(
        self, messages: list[dict], *, stream: bool = False, **sampling: Any
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer OpenAI-style ``messages`` with the model's chat template; a
        ``chat.completion`` dict, or with ``stream`` an iterator of ``chat.completion.chunk``
        dicts. The keywords are :meth:`complete`'s and ``tools``/``tool_choice``
        (:mod:`tessera.llm_tools`); the defaults are llama-cpp-python's (``max_tokens``
        None, ``temperature`` 0.2)."""
        tools = offered_tools(sampling.pop("tools", None), sampling.pop("tool_choice", None))
        args = self._parse("chat", sampling, CHAT_DEFAULTS)
        tokens = encode_chat_prompt(self.tokenizer, self.chat_prompt(messages, tools))
        pieces, totals, response = self._generate("chatcmpl", tokens, args)
        if stream:
            return chat_chunks(response, pieces, totals)
        return response.chat_completion("".join(pieces), totals)

    def stream(
        self, prompt: str | Sequence[int] | list[dict], **sampling: Any
    ) -> Iterator[dict[str, Any]]:
        """The chunks of :meth:`chat` for a list of messages, else of :meth:`complete`."""
        is_chat = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
        return (self.chat if is_chat else self.complete)(prompt, stream=True, **sampling)

    create_completion, create_chat_completion = complete, chat  # llama-cpp-python's names

    def chat_prompt(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text :meth:`chat` evaluates for ``messages`` (and offered ``tools``)."""
        if self._template is None:  # compiled once
            self._template = model_chat_template(self.tokenizer, self._template_source)
        return self._template.render(_check_messages(messages), tools, add_generation_prompt=True)

    def _parse(
        self, method: str, sampling: dict[str, Any], defaults: Mapping[str, Any]
    ) -> GenerationArgs:
        """The call's keywords checked; a call naming no seed draws one from the LLM's."""
        if self._seeds is not None and sampling.get("seed") is None:
            sampling = {**sampling, "seed": int(self._seeds.integers(0, 2**63))}
        return self._keywords.parse(method, sampling, defaults, self.tokenizer)

    def _generate(
        self, kind: str, tokens: list[int], args: GenerationArgs
    ) -> tuple[Iterator[str], RunTotals, Response]:
        """Check what can be checked now; then the text pieces (stop strings applied), the
        totals they fill in and the ``kind`` of response (``cmpl``, ``chatcmpl``) they make."""
        seq, totals = self._sequence(), RunTotals()
        check_prompt(seq.ctx, tokens)  # refused before a stream is handed back, or one closed
        stops = StopStringMatcher(list(args.stops))
        totals.n_prompt = len(tokens)
        totals.events = None if args.n_logprobs is None else []
        pieces = self._pieces(seq, tokens, args.n_predict, args.sampler(), stops, totals)
        if self._active is not None:
            self._active.close()  # its record of the cache is settled before the cache moves
        self._active = pieces
        return pieces, totals, Response.new(kind, self.model_name, self.tokenizer)

    def _pieces(
        self,
        seq: CachedSequence,
        tokens: list[int],
        n_predict: int,
        sampler: AdjustedSampler,
        stops: StopStringMatcher,
        totals: RunTotals,
    ) -> Iterator[str]:
        tok = self.tokenizer
        decoder = StreamDecoder(tok)
        stats = GenerationStats()
        generated = seq.generate(tokens, n_predict, sampler, eog_ids=tok.eog_ids, stats=stats)
        try:
            for token in generated:
                totals.n_completion += 1
                if totals.events is not None:
                    totals.events.append(sampler.last)
                check = stops.feed(decoder.feed(token))
                if check.text:
                    yield check.text
                if check.stopped:
                    totals.finish_reason = "stop"
                    return
                if sampler.complete:  # the constraint's sentence is whole: nothing may follow
                    break
            check = stops.feed(decoder.flush())
            tail = check.text + ("" if check.stopped else stops.flush())
            if tail:
                yield tail
            # generate counts an end-of-generation token it drew but did not yield
            ended = check.stopped or sampler.complete or stats.n_generated > totals.n_completion
            totals.finish_reason = "stop" if ended else "length"
        except GeneratorExit:
            totals.cut = True
            raise
        finally:
            generated.close()

    # -- embeddings ------------------------------------------------------------------------

    def embed(self, texts: str | Sequence[str]) -> np.ndarray:
        """Pooled, L2-normalized embeddings: float32 ``(n, n_embd)`` for a list of texts,
        ``(n_embd,)`` for one. A model that pools ``none`` (most generative models) needs
        ``LLM(..., pooling="mean")`` (or ``cls``, ``last``)."""
        from tessera.engine.embed import Embedder

        self._check_open()
        if self._embedder is None:
            self._embedder = Embedder(self.model, pooling=self._pooling)
        if self._embedder.pooling in ("none", "rank"):
            raise TesseraError(
                f"this model pools '{self._embedder.pooling}', which gives no single vector per "
                "text; pass LLM(..., pooling='mean') (or 'cls', 'last') to embed with it"
            )
        one = isinstance(texts, str)
        vectors, _ = self._embedder.embed_texts([texts] if one else list(texts))
        return vectors[0] if one else vectors

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Free the context, the embedder and the model; later calls raise."""
        if self._active is not None:
            self._active.close()
        self._active = self._seq = self._embedder = None
        self.model = None
        self._closed = True

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

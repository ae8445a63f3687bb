"""The sampling keywords of :class:`tessera.LLM` mapped onto the engine's sampler chain.

``complete``, ``chat`` and ``stream`` take every setting of
:class:`~tessera.engine.sampling.SamplerParams` under its own name (llama.cpp's, which are
llama-cpp-python's where it has the setting: ``temperature``, ``top_k``, ``top_p``,
``min_p``, ``typical_p``, ``repeat_penalty``, ``presence_penalty``, ``frequency_penalty``,
``seed``), plus ``max_tokens``, ``stop``, ``logit_bias``, ``grammar`` (GBNF text),
``response_format`` (OpenAI's) and the logprobs keywords (``logprobs=N`` in ``complete``,
``logprobs=True, top_logprobs=N`` in ``chat``). Logit bias and an output constraint are
applied as the server's slot engine applies them: the bias is added to the logits, then the
constraint draws with the plain sampler on the masked row. A constraint kind comes from the plugin
runtime's catalogue (the ``tessera_register_constraints`` hook), never from an import.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from tessera.contract.constraint_fields import compile_constraint, response_format_constraint
from tessera.contract.constraints import Constraint
from tessera.engine.dry import DryBreakers
from tessera.engine.logprobs import token_event
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.engine.slot_types import TokenEvent
from tessera.errors import TesseraError

#: The keywords that are :class:`SamplerParams` fields (DRY's token-form breakers are made
#: from ``dry_sequence_breakers`` with the model's vocabulary).
SAMPLER_KEYWORDS = tuple(a.name for a in attrs.fields(SamplerParams) if a.name != "dry_breakers")
#: Every sampling keyword of ``complete``, ``chat`` and ``stream``.
KEYWORDS = (
    *SAMPLER_KEYWORDS,
    "max_tokens",
    "stop",
    "logit_bias",
    "grammar",
    "response_format",
    "logprobs",
    "top_logprobs",
)
#: The most alternatives per token the logprobs keywords take (OpenAI's and the server's).
MAX_TOP_LOGPROBS = 20
#: llama-cpp-python's keywords that name a stage or output tessera does not have, with the
#: values that leave it off: taken at those (code written for its ``Llama`` runs as it is),
#: refused at any other. Mirostat's tau and eta do nothing while ``mirostat_mode`` is 0.
OFF_VALUES: Mapping[str, tuple[Any, ...]] = {
    "suffix": (None,),
    "echo": (False,),
    "tfs_z": (1.0,),
    "mirostat_mode": (0,),
    "mirostat_tau": (),
    "mirostat_eta": (),
    "model": (None,),
    "stopping_criteria": (None,),
    "logits_processor": (None,),
    "tools": (None,),  # chat takes them (tessera.llm_tools), complete at None only
    "tool_choice": (None,),
    "functions": (None,),
    "function_call": (None,),
}
#: What to do instead, for the keywords of :data:`OFF_VALUES` that tessera has elsewhere.
WAY_OUT: Mapping[str, str] = {
    "tools": "tools belong to a chat; call LLM.chat(messages, tools=...) instead",
    "tool_choice": "a tool choice belongs to a chat; call LLM.chat(messages, tools=..., "
    "tool_choice=...) instead",
    "functions": "functions is the deprecated form of tools; call LLM.chat(messages, "
    "tools=...) instead",
    "function_call": "function_call is the deprecated form of tool_choice; call "
    "LLM.chat(messages, tools=..., tool_choice=...) instead",
}
#: llama-cpp-python's defaults where they differ between its two methods.
COMPLETE_DEFAULTS: Mapping[str, Any] = {"max_tokens": 16, "temperature": 0.8}
CHAT_DEFAULTS: Mapping[str, Any] = {"max_tokens": None, "temperature": 0.2}


@attrs.frozen
class GenerationArgs:
    """What one call asked for, checked: the sampler settings, the token budget (-1: until
    the model ends or the context is full), the stop strings, the logit bias, the
    factory of the output constraint (None: unconstrained) and the number of top
    alternatives each token's logprob comes with (None: no logprobs)."""

    params: SamplerParams
    n_predict: int
    stops: tuple[str, ...]
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: Callable[[], Constraint] | None = attrs.field(default=None, eq=False)
    n_logprobs: int | None = None

    def sampler(self) -> AdjustedSampler:
        """A fresh sampler for one generation (its seeded RNG, a fresh constraint)."""
        made = self.constraint() if self.constraint is not None else None
        return AdjustedSampler(Sampler(self.params), self.logit_bias, made, self.n_logprobs)


class AdjustedSampler:
    """The engine's :class:`Sampler` with a logit bias added and a constraint applied; with
    ``n_logprobs``, :attr:`last` is the :class:`TokenEvent` of the latest token drawn (its
    logprob from the raw logits, as the server's slot engine reports it)."""

    def __init__(
        self,
        base: Sampler,
        logit_bias: Sequence[tuple[int, float]] = (),
        constraint: Constraint | None = None,
        n_logprobs: int | None = None,
    ) -> None:
        self.base, self.params, self.rng = base, base.params, base.rng
        self.constraint = constraint
        self.n_logprobs = n_logprobs
        self.last: TokenEvent | None = None
        self._ids = np.array([t for t, _ in logit_bias], dtype=np.int64)
        self._bias = np.array([b for _, b in logit_bias], dtype=np.float32)

    @property
    def complete(self) -> bool:
        """Whether the constraint allows nothing but the end of generation now."""
        return self.constraint is not None and self.constraint.complete

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token as :meth:`Sampler.sample` draws it, after the bias and the constraint."""
        raw = logits
        if len(self._ids):
            logits = np.array(logits, dtype=np.float32)
            np.add.at(logits, self._ids, self._bias)
        if self.constraint is None:
            token = self.base.sample(logits, history)
        else:
            token = self.constraint.sample(self.base, logits, history)
            self.constraint.accept(token)
        if self.n_logprobs is not None:
            self.last = token_event(raw, token, self.n_logprobs)
        return token


def _logit_bias(value: Any, n_vocab: int) -> tuple[tuple[int, float], ...]:
    """llama-cpp-python's ``{token id: bias}`` (OpenAI's string ids too), each bias clamped
    to OpenAI's [-100, 100] as the server clamps it."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TesseraError(f"logit_bias must be a dict of token id to bias, got {value!r}")
    out = []
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        number = isinstance(bias, numbers.Real) and not isinstance(bias, bool)
        if not 0 <= token < n_vocab or not number or not math.isfinite(bias):
            raise TesseraError(
                f"logit_bias must map token ids in [0, {n_vocab}) to finite numbers; got "
                f"{key!r}: {bias!r}"
            )
        out.append((token, float(max(-100.0, min(100.0, bias)))))
    return tuple(out)


def _top_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise TesseraError(f"{name} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {value!r}")
    return value


def _n_logprobs(method: str, args: Mapping[str, Any]) -> int | None:
    """The alternatives per token asked for (None: no logprobs): ``complete`` takes the
    completions API's ``logprobs=N``, ``chat`` the chat API's ``logprobs=True`` with
    ``top_logprobs=N`` (default 0, as the server's)."""
    logprobs, top = args.get("logprobs"), args.get("top_logprobs")
    if method == "complete":
        if top is not None:
            raise TesseraError(
                "complete takes logprobs=N for the alternatives; top_logprobs is chat's"
            )
        return None if logprobs is None or logprobs is False else _top_count("logprobs", logprobs)
    if not (logprobs is None or isinstance(logprobs, bool)):
        raise TesseraError(
            f"chat's logprobs is True or False (top_logprobs=N asks for alternatives), "
            f"got {logprobs!r}"
        )
    if not logprobs:
        if top:
            raise TesseraError("top_logprobs needs logprobs=True as well")
        return None
    return _top_count("top_logprobs", 0 if top is None else top)


class SamplingKeywords:
    """Checks the sampling keywords of one LLM call; keeps DRY's breakers in token form (a
    pass over the vocabulary) for the next calls. Compiled constraints are cached by their
    kind, per tokenizer and spec."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self._breakers: dict[tuple[str, ...], DryBreakers] = {}

    def parse(
        self, method: str, given: Mapping[str, Any], defaults: Mapping[str, Any], tokenizer: Any
    ) -> GenerationArgs:
        """The checked :class:`GenerationArgs` of ``method``'s keywords ``given`` over
        ``defaults``; an unknown keyword is a TypeError naming it, and so is one of
        :data:`OFF_VALUES` at a value that would turn its stage on."""
        unknown = sorted(set(given) - set(KEYWORDS) - set(OFF_VALUES))
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            raise TypeError(
                f"LLM.{method}() got unexpected keyword argument(s) {names}; its sampling "
                f"keywords are {', '.join(KEYWORDS)}"
            )
        for name in sorted(set(given) & set(OFF_VALUES)):
            off = OFF_VALUES[name]
            value = given[name]
            # None and the booleans by identity, so 0 is not taken for False
            same = (value is v if v is None or isinstance(v, bool) else value == v for v in off)
            if off and not any(same):
                way_out = WAY_OUT.get(name) or (
                    f"tessera has no such stage or output; leave {name} out (or give {off[0]!r})"
                )
                raise TypeError(f"LLM.{method}() cannot take {name}={value!r}: {way_out}")
        args = {**defaults, **given}
        sampling = {k: args[k] for k in SAMPLER_KEYWORDS if args.get(k) is not None}
        params = self._with_breakers(SamplerParams(**sampling), tokenizer)
        max_tokens = args.get("max_tokens")
        stop = args.get("stop")
        return GenerationArgs(
            params=params,
            n_predict=max_tokens if max_tokens is not None and max_tokens > 0 else -1,
            stops=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            logit_bias=_logit_bias(args.get("logit_bias"), tokenizer.n_vocab),
            constraint=self._constraint(args, tokenizer),
            n_logprobs=_n_logprobs(method, args),
        )

    def _with_breakers(self, params: SamplerParams, tokenizer: Any) -> SamplerParams:
        if params.dry_multiplier == 0.0:
            return params
        key = params.dry_sequence_breakers
        if key not in self._breakers:  # a pass over the whole vocabulary: once per list
            self._breakers[key] = DryBreakers.for_tokenizer(key, tokenizer)
        return attrs.evolve(params, dry_breakers=self._breakers[key])

    def _constraint(
        self, args: Mapping[str, Any], tokenizer: Any
    ) -> Callable[[], Constraint] | None:
        asked = []
        if args.get("grammar") is not None:
            if not isinstance(args["grammar"], str):
                raise TesseraError("grammar must be the text of a GBNF grammar")
            asked.append(("grammar", "gbnf", args["grammar"]))
        found = response_format_constraint(args.get("response_format"))
        if found is not None:
            asked.append(("response_format", *found))
        return compile_constraint(self.runtime, asked, tokenizer)

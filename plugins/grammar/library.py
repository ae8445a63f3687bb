"""Compiled grammars, cached per (tokenizer, kind, spec): the vocabulary tables once per
tokenizer, one compiled matcher per spec, copied for each generation."""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tessera.contract.constraints import ConstraintSpecError
from tessera.plugins.grammar.constraint import REJECTION, GrammarConstraint
from tessera.plugins.grammar.vocab import ll_tokenizer
from tessera.switches import flag

#: Compiled grammars kept per tokenizer (least recently used dropped first).
CACHE_SIZE = 64


class _TokenizerGrammars:
    """One tokenizer's llguidance tables and its compiled matchers."""

    def __init__(self, tokenizer: Any) -> None:
        self.ll_tokenizer = ll_tokenizer(tokenizer)
        self.n_vocab = int(tokenizer.n_vocab)
        self.matchers: OrderedDict[str, Any] = OrderedDict()


class GrammarLibrary:
    """Compiles specs of any kind for any tokenizer, each once; thread-safe (the server
    compiles in worker threads, the engine copies matchers in its own)."""

    def __init__(self, cache_size: int = CACHE_SIZE) -> None:
        self.cache_size = cache_size
        self._lock = threading.Lock()
        # a tokenizer's tables live as long as the tokenizer (its model) does
        self._by_tokenizer: weakref.WeakKeyDictionary[Any, _TokenizerGrammars] = (
            weakref.WeakKeyDictionary()
        )

    def tables(self, tokenizer: Any) -> _TokenizerGrammars:
        with self._lock:
            found = self._by_tokenizer.get(tokenizer)
            if found is None:
                found = self._by_tokenizer[tokenizer] = _TokenizerGrammars(tokenizer)
            return found

    def compile(
        self, kind: str, source: Callable[[Any], str], spec: Any, tokenizer: Any
    ) -> Callable[[], GrammarConstraint]:
        """A factory of constraints for ``spec`` of ``kind`` (``source`` makes its grammar
        text); a refused spec raises :class:`ConstraintSpecError` here, before any work."""
        import llguidance

        tables = self.tables(tokenizer)
        key = kind + "\0" + json.dumps(spec, sort_keys=True, default=str)
        with self._lock:
            matcher = tables.matchers.get(key)
            if matcher is not None:
                tables.matchers.move_to_end(key)
        if matcher is None:
            matcher = llguidance.LLMatcher(tables.ll_tokenizer, source(spec), log_level=0)
            if matcher.is_error():
                raise ConstraintSpecError(" ".join(matcher.get_error().split()))
            with self._lock:
                tables.matchers[key] = matcher
                while len(tables.matchers) > self.cache_size:
                    tables.matchers.popitem(last=False)
        rejection = flag(REJECTION)
        n_vocab = tables.n_vocab

        def new() -> GrammarConstraint:
            return GrammarConstraint(matcher.deep_copy(), n_vocab, rejection)

        return new

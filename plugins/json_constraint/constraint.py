"""Constrained sampling for ``response_format: {"type": "json_object"}``.

:class:`JsonConstraintFactory` is built once per tokenizer: it renders every token to bytes,
builds a byte trie of the vocabulary and caches allowed-token masks per parser state.
:meth:`JsonConstraintFactory.new` gives one :class:`JsonConstraint` per request; its
``sample`` draws from exactly the distribution the plain :class:`~tessera.engine.sampling.Sampler`
would give on logits where every token that breaks the JSON prefix is set to -inf, and its
``accept`` advances the parser. When the top-level object is complete only end-of-generation
tokens are allowed, so generation stops there.

Tokens are checked as bytes, not text: a byte-level BPE token may hold part of a UTF-8
character, and the parser (:mod:`tessera.plugins.json_constraint.prefix`) validates UTF-8 byte by
byte.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.engine.sampling import Sampler
from tessera.errors import TesseraError
from tessera.plugins.json_constraint.masks import MaskBuilder
from tessera.plugins.json_constraint.prefix import JsonPrefix
from tessera.switches import ON, Switch, flag

# Rejections before the whole allowed mask is computed instead (bounds the worst case).
REJECTION_TRIES = 16
# Times a parser-state key is sampled without its mask before the mask is computed: rare
# states never pay for a mask, frequent ones get the cheaper cached mask.
LAZY_VISITS = 1
# Allowed masks kept per factory (one per parser state key, n_vocab bools each).
MASK_CACHE_SIZE = 256
# Tokens past the top valid one a min-p-only sampler looks at before computing the mask.
MIN_P_WINDOW = 64
REJECTION = Switch(
    "TESSERA_JSON_REJECTION",
    "JSON output samples first and checks the token (rejection); 0: the full mask every step",
    ON,
    default=True,
)
VECTOR = Switch(
    "TESSERA_JSON_VECTOR",
    "JSON string states checked by the numpy scan over the vocabulary; 0: the trie walk",
    ON,
    default=True,
)


class JsonConstraintFactory:
    """Per-tokenizer tables for JSON-constrained sampling: token bytes, mask builder, cache."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_ws_run: int = 16,
        rejection: bool | None = None,
        vector_strings: bool | None = None,
        rejection_tries: int = REJECTION_TRIES,
        lazy_visits: int = LAZY_VISITS,
        mask_cache_size: int = MASK_CACHE_SIZE,
    ) -> None:
        self.n_vocab = int(tokenizer.n_vocab)
        self.max_ws_run = max_ws_run
        if rejection is None:
            rejection = flag(REJECTION)
        self.rejection = rejection
        self.rejection_tries = rejection_tries
        self.mask_cache_size = mask_cache_size
        self.lazy_visits = lazy_visits
        self._visits: dict[tuple, int] = {}  # lazy samples per uncached state key
        eog = [bool(tokenizer.is_eog(i)) for i in range(self.n_vocab)]
        self.eog = np.array(eog, dtype=bool).reshape(self.n_vocab)
        # None: never allowed inside the JSON (end-of-generation, control, empty tokens).
        self.token_bytes: list[bytes | None] = [
            data if data and not eog[i] and not tokenizer.is_special(i) else None
            for i, data in enumerate(map(tokenizer.token_to_bytes, range(self.n_vocab)))
        ]
        if not self.eog.any():
            raise TesseraError(
                "this tokenizer has no end-of-generation token, so JSON output cannot end; "
                "use a model whose vocabulary sets tokenizer.ggml.eos_token_id"
            )
        self._masks: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        if vector_strings is None:
            vector_strings = flag(VECTOR)
        self._builder = MaskBuilder(self.token_bytes, vector_strings)

    def new(self) -> JsonConstraint:
        """A fresh constraint for one generation, at the start of the document."""
        return JsonConstraint(self)

    def sample_lazily(self, state: JsonPrefix) -> bool:
        """Whether to try rejection for this uncached state (counts the visit)."""
        if not self.rejection:
            return False
        if len(self._visits) > 65536:
            self._visits.clear()  # bounded memory; forgetting only delays some masks
        key = state.key()
        seen = self._visits.get(key, 0)
        self._visits[key] = seen + 1
        return seen < self.lazy_visits

    def cached_mask(self, state: JsonPrefix) -> np.ndarray | None:
        """The allowed mask of ``state`` if its key is cached, else None."""
        entry = self._masks.get(state.key())
        if entry is None:
            return None
        self._masks.move_to_end(state.key())
        return self._resolve(state, entry)

    def allowed_mask(self, state: JsonPrefix) -> np.ndarray:
        """Bool mask over the vocabulary of tokens that keep ``state`` a valid prefix."""
        if state.complete:
            return self.eog.copy()
        mask = self.cached_mask(state)
        if mask is not None:
            return mask
        entry = self._builder.entry(state)
        if self.mask_cache_size > 0:
            self._masks[state.key()] = entry
            if len(self._masks) > self.mask_cache_size:
                self._masks.popitem(last=False)
        return self._resolve(state, entry)

    def _resolve(self, state: JsonPrefix, entry: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        base, dependent = entry
        mask = base.copy()
        for i in dependent:
            mask[i] = state.accepts(self.token_bytes[i])
        return mask


class JsonConstraint:
    """One generation constrained to a JSON object: ``allows``/``accept``/``sample``."""

    def __init__(self, factory: JsonConstraintFactory) -> None:
        self.factory = factory
        self.state = JsonPrefix(factory.max_ws_run)
        self.finished = False  # an end-of-generation token was accepted

    @property
    def complete(self) -> bool:
        """True once the top-level object is closed."""
        return self.state.complete

    def allows(self, token_id: int) -> bool:
        """Whether ``token_id`` may come next: EOG only once complete, then nothing else."""
        f = self.factory
        if self.finished or not 0 <= token_id < f.n_vocab:
            return False
        if self.state.complete or f.eog[token_id]:
            return self.state.complete and bool(f.eog[token_id])
        data = f.token_bytes[token_id]
        return data is not None and self.state.accepts(data)

    def accept(self, token_id: int) -> None:
        """Advance past ``token_id``; it must be allowed."""
        if not self.allows(token_id):
            raise TesseraError(
                f"token {token_id} cannot continue the JSON output here; "
                "pick tokens with JsonConstraint.sample or check them with allows()"
            )
        if self.factory.eog[token_id]:
            self.finished = True
        else:
            self.state.feed(self.factory.token_bytes[token_id])

    def allowed_mask(self) -> np.ndarray:
        """Bool mask over the vocabulary of the tokens ``allows`` accepts."""
        if self.finished:
            return np.zeros(self.factory.n_vocab, dtype=bool)
        return self.factory.allowed_mask(self.state)

    def sample(self, sampler: Sampler, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """A token drawn as ``sampler.sample`` would draw it with every disallowed token's
        logit at -inf (the repetition penalty sees ``history`` as usual)."""
        logits = sampler.apply_penalty(np.asarray(logits, dtype=np.float32), history)
        f = self.factory
        if self.finished:
            raise TesseraError("the JSON output already ended; start a new JsonConstraint")
        if len(logits) < f.n_vocab:
            raise TesseraError(
                f"logits have {len(logits)} entries but the vocabulary has {f.n_vocab} tokens; "
                "pass the model's full logits row"
            )
        logits = logits.copy()
        logits[f.n_vocab :] = -np.inf  # padding rows past the vocabulary are never tokens
        mask = None if self.state.complete else f.cached_mask(self.state)
        if mask is None and not self.state.complete and f.sample_lazily(self.state):
            token = self._sample_lazily(sampler, logits)
            if token is not None:
                return token
        if mask is None:
            mask = self.allowed_mask()
        if not mask.any():
            raise TesseraError(
                "no token of this vocabulary can continue the JSON output; "
                "the model's vocabulary lacks the characters JSON needs"
            )
        masked = np.full_like(logits, -np.inf)
        masked[: f.n_vocab][mask] = logits[: f.n_vocab][mask]
        return sampler.sample(masked)

    def _sample_lazily(self, sampler: Sampler, logits: np.ndarray) -> int | None:
        """Exact draws that check only a few tokens, or None after too many rejections.

        Greedy and plain softmax sampling (no top-k/top-p/min-p) redraw with each rejected
        token masked: conditioning a softmax on the allowed set is the masked softmax. With
        top-k or min-p the result depends only on the best allowed tokens (the first k, or
        those above the min-p bar), so those are found by walking the logits in order.
        """
        p, tries = sampler.params, self.factory.rejection_tries
        if not p.greedy and p.needs_full_distribution:
            return None  # typical-p, top-n-sigma and XTC read every allowed token's odds
        n = len(logits)
        top_k = p.top_k if 0 < p.top_k < n else 0
        if p.greedy or (top_k == 0 and p.top_p >= 1.0 and p.min_p <= 0.0):
            work = logits.copy()
            for _ in range(tries):
                token = int(np.argmax(work)) if p.greedy else sampler.sample(work)
                if self.allows(token):
                    return token
                work[token] = -np.inf
            return None
        if top_k == 0 and p.top_p < 1.0:
            return None  # top-p needs the mass of every allowed token: compute the mask
        window = min(n, (top_k or MIN_P_WINDOW) + tries)
        order = np.argpartition(-logits, window - 1)[:window] if window < n else np.arange(n)
        order = order[np.argsort(-logits[order], kind="stable")]
        found: list[int] = []
        rejected = 0
        # min-p keeps tokens within a factor min_p of the best allowed one; slack for rounding
        bar = math.log(p.min_p) - 1e-3 if p.min_p > 0.0 else -math.inf
        known = window == n  # whether the kept set is known once the loop ends
        for token in order.tolist():
            if found and p.top_p >= 1.0 and logits[token] < logits[found[0]] + bar:
                known = True
                break
            if self.allows(token):
                found.append(token)
                if len(found) == top_k:
                    known = True
                    break
            else:
                rejected += 1
                if rejected > tries:
                    return None
        if not known or not found:
            return None
        masked = np.full_like(logits, -np.inf)
        masked[found] = logits[found]
        return sampler.sample(masked)

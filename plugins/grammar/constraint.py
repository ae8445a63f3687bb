"""One generation kept inside a compiled grammar: llguidance's matcher, its token mask
applied to this slot's logits row, and the sampler's own draw on what is left.

The mask is computed by llguidance (Rust) into a preallocated bitmask, one bit per token,
and unpacked with numpy; no Python loop touches the vocabulary. With a greedy sampler the
unmasked argmax is tried first (:data:`REJECTION`): when the grammar allows it, it is the
masked argmax too, and the mask is never computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.contract.constraints import Constraint
from tessera.errors import TesseraError
from tessera.switches import ON, Switch

REJECTION = Switch(
    "TESSERA_GRAMMAR_REJECTION",
    "greedy constrained output tries the unmasked argmax first; 0: the full mask every step",
    ON,
    default=True,
)


class GrammarConstraint(Constraint):
    """A generation constrained by one llguidance grammar (see :mod:`tessera.plugins.grammar`)."""

    def __init__(self, matcher: Any, n_vocab: int, rejection: bool) -> None:
        #: This generation's own ``llguidance.LLMatcher`` (a copy of the compiled one).
        self.matcher = matcher
        self._raise_on_error()
        self.n_vocab = n_vocab
        self.rejection = rejection
        # one bit per token, filled in place by llguidance at every masked step
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.n_masks = 0  # masked steps so far (the rejection path skips the mask)

    @property
    def complete(self) -> bool:
        return bool(self.matcher.is_stopped())

    def allowed_mask(self) -> np.ndarray:
        """Bool mask over the vocabulary of the tokens the grammar allows next."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        self._raise_on_error()
        self.n_masks += 1
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")
        return bits[: self.n_vocab].view(bool)

    def sample(self, sampler: Any, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = np.asarray(logits, dtype=np.float32)
        if len(logits) < self.n_vocab:
            raise TesseraError(
                f"logits have {len(logits)} entries but the vocabulary has {self.n_vocab} "
                "tokens; pass the model's full logits row"
            )
        if self.rejection and sampler.params.greedy:
            token = sampler.sample(logits[: self.n_vocab], history)
            if self.matcher.validate_tokens([token]) == 1:
                return token
        allowed = self.allowed_mask()
        if not allowed.any():
            raise TesseraError(
                "no token of this vocabulary can continue the constrained output; the "
                "grammar needs characters the model's vocabulary cannot write"
            )
        # padding rows past the vocabulary are never tokens, so only the first n_vocab count
        masked = np.where(allowed, logits[: self.n_vocab], np.float32(-np.inf))
        return sampler.sample(masked, history)

    def accept(self, token: int) -> None:
        # checked first: a refused token would leave the matcher in its error state
        if self.matcher.validate_tokens([int(token)]) != 1:
            raise TesseraError(
                f"token {token} cannot continue the constrained output here; pick tokens "
                "with GrammarConstraint.sample"
            )
        self.matcher.consume_token(int(token))
        self._raise_on_error()

    def _raise_on_error(self) -> None:
        if self.matcher.is_error():
            first_line = self.matcher.get_error().strip().splitlines()[0]
            raise TesseraError(f"the grammar engine stopped: {first_line}")

"""Log-probabilities of sampled tokens, and the two OpenAI shapes that report them.

The numbers are a log-softmax of the raw logits the sampler was given (before logit bias,
penalties or a constraint), as llama-server reports them. The server's slot engine and
:class:`tessera.LLM` both use this module, so their logprobs are the same numbers in the
same shapes: chat's ``logprobs.content`` entries and the completions' ``logprobs`` object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.engine.slot_types import TokenEvent


def log_softmax(row: np.ndarray) -> np.ndarray:
    """``log(softmax(row))`` in float64, shifted by the row's maximum so it cannot overflow."""
    row = np.asarray(row, dtype=np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def token_event(row: np.ndarray, token: int, n_top: int) -> TokenEvent:
    """The :class:`TokenEvent` of ``token`` drawn from logits ``row``: its logprob and the
    ``n_top`` most likely tokens, best first (ties by token id)."""
    logp = log_softmax(row)
    top = np.argsort(-logp, kind="stable")[:n_top]
    return TokenEvent(token, float(logp[token]), tuple((int(t), float(logp[t])) for t in top))


def chat_logprob_entry(tokenizer: Any, event: TokenEvent) -> dict[str, Any]:
    """One entry of chat's ``logprobs.content``: the token's text, logprob and bytes, and
    its ``top_logprobs`` alternatives in the same form."""

    def one(token: int, logprob: float) -> dict[str, Any]:
        raw = tokenizer.token_to_bytes(token)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

    entry = one(event.token, event.logprob)
    entry["top_logprobs"] = [one(t, lp) for t, lp in event.top_logprobs]
    return entry


def completion_logprobs(
    tokenizer: Any, events: Sequence[TokenEvent], offset: int = 0
) -> dict[str, Any]:
    """The completions' ``logprobs`` object: token texts, their logprobs, a ``{text:
    logprob}`` dict of alternatives per token and each token's character offset in the
    text (counted from ``offset``)."""
    pieces = [tokenizer.token_to_piece(e.token) for e in events]
    offsets, at = [], offset
    for piece in pieces:
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": pieces,
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [
            {tokenizer.token_to_piece(t): lp for t, lp in e.top_logprobs} for e in events
        ],
        "text_offset": offsets,
    }

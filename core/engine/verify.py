"""Verifying a draft: which proposed tokens the target keeps, and one token of its own.

Each step evaluates ``[last token, d_1 .. d_k]`` on the target in one batch, with logits
for every row. Row ``j`` is the target's distribution for the token after ``d_j`` (row 0:
after the last token). Acceptance, token by token (Leviathan et al. / Chen et al. 2023):

- greedy: keep ``d_j`` while it equals the target's argmax; the first mismatch is replaced
  by the argmax, so the output is token for token what the target alone would give;
- sampling: keep ``d_j`` with probability ``min(1, p(d_j) / q(d_j))`` (``p``: the target's
  sampling distribution after penalties/top-k/top-p/min-p/temperature, ``q``: the
  drafter's); on rejection draw from ``max(p - q, 0)`` renormalized. The emitted tokens
  are then distributed exactly as the target's own samples.

After a full acceptance the last row gives one more token for free. Rejected rows leave
the target's KV cache with ``KVCache.seq_rm``, so the cache ends exactly as after plain
decoding; drafters roll their own state back (see :class:`tessera.contract.spec.SpecDecoder`).
Plain decoding is the case of an empty draft: one row, one sampled token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.contract.spec import Draft
from tessera.engine.sampling import Sampler

#: The draft of a plain decoding step.
NO_DRAFT = Draft(())


def accept_draft(
    draft: Draft,
    rows: np.ndarray,
    sampler: Sampler,
    history: Sequence[int],
) -> list[int]:
    """The tokens to emit for ``draft`` given target logits ``rows`` (``len(draft) + 1``
    rows): the accepted prefix of the draft followed by one token of the target's."""
    out: list[int] = []
    hist = list(history) if draft.tokens else history  # plain decoding copies nothing
    for j, d in enumerate(draft.tokens):
        if sampler.params.greedy:
            t = sampler.sample(rows[j], hist)
            if t != d:
                return [*out, t]
        else:
            p = sampler.probs(rows[j], hist)
            q_d = 1.0 if draft.probs is None else float(draft.probs[j][d])
            # accept d with probability min(1, p(d) / q(d))
            if sampler.rng.random() * q_d >= p[d]:
                residual = p.copy()
                if draft.probs is None:
                    residual[d] = 0.0
                else:
                    residual = np.maximum(p - draft.probs[j], 0.0)
                total = residual.sum()
                residual = residual / total if total > 0 else p
                return [*out, int(sampler.rng.choice(len(residual), p=residual))]
        out.append(d)
        hist.append(d)
    return [*out, sampler.sample(rows[len(draft)], hist)]


def trim_draft(draft: Draft, n_max: int, draft_min: int) -> Draft:
    """``draft`` cut to ``n_max`` tokens; no draft when fewer than ``draft_min`` (and at
    least one) tokens are left, since a batch for so few does not pay (``--draft-min``)."""
    if len(draft) > n_max:
        probs = None if draft.probs is None else draft.probs[:n_max]
        draft = Draft(draft.tokens[:n_max], probs)
    return draft if len(draft) >= max(draft_min, 1) else NO_DRAFT

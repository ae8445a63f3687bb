"""``--spec-type select``: several cheap candidate drafts, the draft transformer picks one.

In the spirit of llama.cpp's LiliCorr: proposers make candidate continuations, the small
draft model scores them, and only the best goes to the target. Candidates:

- the draft model's own greedy chain (``-md``; see :mod:`tessera.plugins.spec_draft`);
- its top-k branch: the draft's second choice for the first token, continued by history
  lookup;
- up to :data:`N_NGRAM` distinct n-gram continuations of the history;
- the target's MTP chain when the target has nextn layers.

Scoring runs every candidate other than the greedy chain (whose probabilities are known)
through the draft model in one batch, one sequence per candidate, each sharing the
history's cells with ``seq_cp`` (no tensor is copied). A candidate's score is the
expected number of tokens the target accepts if the draft's probabilities were the
target's: ``sum_j prod_{i<=j} q(c_i)``. The candidates' cells are removed afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.hookspecs import hookimpl
from tessera.spec_decoder import Draft, SpecDecoder, SpecDecoderInfo, SpecParams

TESSERA_PLUGIN_API = 1

#: n-gram continuations offered per step.
N_NGRAM = 3


def expected_accepted(probs: Sequence[float]) -> float:
    """``sum_j prod_{i<=j} p_i``: expected accepted length of a chain with these odds."""
    return float(np.cumprod(np.asarray(probs, dtype=np.float64)).sum()) if len(probs) else 0.0


class SelectDecoder(SpecDecoder):
    """Best of several candidate drafts, scored by the draft transformer."""

    def __init__(self, ctx: Any, params: SpecParams, runtime: Any) -> None:
        from tessera.plugins.spec_draft import DraftModelDecoder

        self.drafter = DraftModelDecoder(ctx, params, runtime, n_seq_max=N_NGRAM + 3)
        self.mtp = None
        if getattr(ctx.model.config, "n_nextn", 0):
            from tessera.plugins.spec_mtp import MTPDecoder

            self.mtp = MTPDecoder(ctx, params, runtime)
            self.needs_all_prompt_outputs = True
        #: How often each proposer's candidate won (for reports and tests).
        self.wins: dict[str, int] = {}

    def begin(self, prompt: Sequence[int], seq_id: int) -> None:
        self.drafter.begin(prompt, seq_id)
        if self.mtp is not None:
            self.mtp.begin(prompt, seq_id)

    def candidates(self, history: Sequence[int], n_max: int) -> list[tuple[str, tuple[int, ...]]]:
        from tessera.plugins.spec_ngram import ngram_candidates

        out: list[tuple[str, tuple[int, ...]]] = []
        first = self.drafter.first_probs
        if first is not None and n_max > 0:
            alt = int(np.argsort(-first)[1])
            cont = ngram_candidates([*history, alt], n_max - 1, 1)
            out.append(("draft-top2", (alt, *(cont[0] if cont else ()))))
        out += [("ngram", c) for c in ngram_candidates(history, n_max, N_NGRAM)]
        if self.mtp is not None:
            out.append(("mtp", self.mtp.draft(history, n_max).tokens))
        return out

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        greedy, greedy_probs = self.drafter.draft_with_probs(history, n_max)
        best, best_score = ("draft", greedy.tokens), expected_accepted(greedy_probs)
        cands = [(k, c) for k, c in self.candidates(history, n_max) if c and c != greedy.tokens]
        for (kind, cand), score in zip(cands, self._score(history, cands), strict=True):
            if score > best_score:
                best, best_score = (kind, cand), score
        self.wins[best[0]] = self.wins.get(best[0], 0) + 1
        return Draft(best[1])

    def _score(self, history: Sequence[int], cands: list[tuple[str, tuple[int, ...]]]) -> list:
        """Expected accepted length of each candidate under the draft model (one batch)."""
        from tessera.batch import Batch
        from tessera.plugins.spec_draft import softmax

        if not cands or self.drafter.first_probs is None:
            return [0.0] * len(cands)
        kv, n = self.drafter.ctx.kv, len(history)
        batches = []
        for s, (_, cand) in enumerate(cands, start=1):
            kv.seq_cp(0, s, 0, n)  # candidate s sees the history's cells
            # the last token's row gives nothing new: score rows of c_1 .. c_{m-1}
            batches.append(Batch.for_sequence(cand[:-1], n, s, "all"))
        rows = [b for b in batches if len(b)]
        logits = self.drafter.ctx.decode(Batch.concat(rows)) if rows else np.zeros((0, 1))
        for s in range(1, len(cands) + 1):
            kv.seq_rm(s, 0)
        scores, at = [], 0
        for _, cand in cands:
            probs = [float(self.drafter.first_probs[cand[0]])]
            for j, t in enumerate(cand[1:]):
                probs.append(float(softmax(logits[at + j])[t]))
            at += len(cand) - 1
            scores.append(expected_accepted(probs))
        return scores

    def accepted(self, history: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        if self.mtp is not None:
            self.mtp.accepted(history, n_drafted, n_accepted)

    def close(self) -> None:
        if self.mtp is not None:
            self.mtp.close()


def create(ctx: Any, params: SpecParams, runtime: Any) -> SelectDecoder:
    return SelectDecoder(ctx, params, runtime)


@hookimpl
def tessera_register_spec_decoders(register):
    register(
        SpecDecoderInfo(
            "select",
            create,
            "LiliCorr-style: n-gram, draft top-k and MTP candidates scored by the draft model "
            "(-md FILE)",
        )
    )

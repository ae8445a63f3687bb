"""``--spec-type select``: several cheap candidate drafts, the draft transformer picks one.

In the spirit of llama.cpp's LiliCorr: cheap proposers make block drafts, the small draft
transformer scores them, and only the best goes to the target. Candidates:

- the draft model's top-:data:`TOP_K` next tokens (``-md``), each continued by history
  lookup;
- up to :data:`N_NGRAM` distinct n-gram continuations of the history;
- the target's MTP chain when the target has nextn layers.

The draft model runs twice per step, never token by token: once to bring its cache to the
history (its next-token distribution), once to score every candidate in one batch, one
sequence per candidate, each sharing the history's cells with ``seq_cp`` (no tensor is
copied). A candidate's score is the expected number of tokens the target accepts if the
draft's probabilities were the target's: ``sum_j prod_{i<=j} q(c_i)``; the winner is cut
where the draft's odds of reaching further fall under ``--draft-p-min``. The candidates'
cells are removed afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.contract.spec import Draft, SpecDecoder, SpecDecoderInfo, SpecParams
from tessera.hookspecs import hookimpl
from tessera.plugins.spec.governor import governed

TESSERA_PLUGIN_API = 2

#: n-gram continuations offered per step.
N_NGRAM = 3
#: The draft model's most likely next tokens offered as candidate starts.
TOP_K = 2


def expected_accepted(probs: Sequence[float]) -> float:
    """``sum_j prod_{i<=j} p_i``: expected accepted length of a chain with these odds."""
    return float(np.cumprod(np.asarray(probs, dtype=np.float64)).sum()) if len(probs) else 0.0


class SelectDecoder(SpecDecoder):
    """Best of several candidate drafts, scored by the draft transformer."""

    def __init__(self, ctx: Any, params: SpecParams, runtime: Any) -> None:
        from tessera.plugins.spec.draft import DraftModelDecoder

        self.drafter = DraftModelDecoder(ctx, params, runtime, n_seq_max=N_NGRAM + TOP_K + 2)
        self.p_min = params.p_min
        self._chain_probs: list[list[float]] = []
        self.mtp = None
        if getattr(ctx.model.config, "n_nextn", 0):
            from tessera.plugins.spec.mtp import MTPDecoder

            self.mtp = MTPDecoder(ctx, params, runtime)
            self.needs_all_prompt_outputs = True
        #: How often each proposer's candidate won (for reports and tests).
        self.wins: dict[str, int] = {}

    def begin(self, prompt: Sequence[int], seq_id: int) -> None:
        self.drafter.begin(prompt, seq_id)
        if self.mtp is not None:
            self.mtp.begin(prompt, seq_id)

    def candidates(self, history: Sequence[int], n_max: int) -> list[tuple[str, tuple[int, ...]]]:
        """Block drafts from the cheap proposers (no sequential draft-model steps)."""
        from tessera.plugins.spec.ngram import ngram_candidates

        out: list[tuple[str, tuple[int, ...]]] = []
        first = self.drafter.first_probs
        for rank, tok in enumerate(np.argsort(-first)[:TOP_K]):
            # the draft's top-k next tokens, each continued by history lookup
            cont = ngram_candidates([*history, int(tok)], n_max - 1, 1)
            out.append((f"draft-top{rank + 1}", (int(tok), *(cont[0] if cont else ()))))
        out += [("ngram", c) for c in ngram_candidates(history, n_max, N_NGRAM)]
        if self.mtp is not None:
            out.append(("mtp", self.mtp.draft(history, n_max).tokens))
        return out

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        from tessera.plugins.spec.draft import softmax

        if n_max <= 0:
            return Draft(())
        self.drafter.first_probs = softmax(self.drafter.evaluate_history(history))
        cands: list[tuple[str, tuple[int, ...]]] = []
        for kind, cand in self.candidates(history, n_max):
            if cand and cand[:n_max] not in [c for _, c in cands]:
                cands.append((kind, cand[:n_max]))
        scores = self._score(history, cands)
        best = int(np.argmax(scores))
        kind, cand = cands[best]
        self.wins[kind] = self.wins.get(kind, 0) + 1
        # cut the chain where the draft model's odds of reaching further fall under p_min
        probs = self._chain_probs[best]
        keep = len(cand)
        while keep > 1 and float(np.prod(probs[:keep])) < self.p_min:
            keep -= 1
        return Draft(cand[:keep])

    def _score(self, history: Sequence[int], cands: list[tuple[str, tuple[int, ...]]]) -> list:
        """Expected accepted length of each candidate under the draft model (one batch)."""
        from tessera.engine.batch import Batch
        from tessera.plugins.spec.draft import softmax

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
        self._chain_probs = []
        for _, cand in cands:
            probs = [float(self.drafter.first_probs[cand[0]])]
            for j, t in enumerate(cand[1:]):
                probs.append(float(softmax(logits[at + j])[t]))
            at += len(cand) - 1
            self._chain_probs.append(probs)
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
            governed(create),
            "LiliCorr-style: n-gram, draft top-k and MTP candidates scored by the draft model "
            "(-md FILE)",
        )
    )

"""``--spec-type ngram``: draft by looking the recent tokens up in the history itself.

Prompt/history lookup (llama.cpp's ``ngram`` speculators, "prompt lookup decoding"): find
the latest earlier place where the last ``n`` tokens occurred, for ``n`` from
:data:`NGRAM_MAX` down to :data:`NGRAM_MIN`, and propose what followed it there. No extra
model; it pays off on text that repeats its prompt or itself (code, quotes, lists).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.contract.spec import Draft, SpecDecoder, SpecDecoderInfo, SpecParams
from tessera.hookspecs import hookimpl
from tessera.plugins.spec.governor import governed

TESSERA_PLUGIN_API = 2

#: Longest and shortest suffix looked up (longer matches first: they predict better).
NGRAM_MAX = 4
NGRAM_MIN = 2


def ngram_candidates(
    history: Sequence[int], n_max: int, max_candidates: int = 1
) -> list[tuple[int, ...]]:
    """Up to ``max_candidates`` distinct continuations of ``history`` (most specific match
    first, then the most recent), each at most ``n_max`` tokens long."""
    if n_max <= 0 or len(history) < NGRAM_MIN + 1:
        return []
    h = np.asarray(history, dtype=np.int64)
    found: list[tuple[int, ...]] = []
    for n in range(min(NGRAM_MAX, len(h) - 1), NGRAM_MIN - 1, -1):
        suffix = h[-n:]
        # windows[i] = h[i : i + n]; a match must end before the suffix itself starts
        windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        for s in starts[::-1]:
            cont = tuple(int(t) for t in h[s + n : s + n + n_max])
            if cont and cont not in found:
                found.append(cont)
                if len(found) >= max_candidates:
                    return found
    return found


class NgramDecoder(SpecDecoder):
    """Proposes the continuation of the latest matching n-gram of the history."""

    cheap_drafts = True

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        cands = ngram_candidates(history, n_max, 1)
        return Draft(cands[0] if cands else ())


def create(ctx: Any, params: SpecParams, runtime: Any) -> NgramDecoder:
    return NgramDecoder()


@hookimpl
def tessera_register_spec_decoders(register):
    register(
        SpecDecoderInfo(
            "ngram",
            governed(create),
            f"history lookup: continue the latest {NGRAM_MIN}..{NGRAM_MAX}-gram match; no model",
        )
    )

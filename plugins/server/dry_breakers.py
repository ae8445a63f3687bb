"""DRY's sequence breakers in the token form of a served model's vocabulary.

A request names its breakers as text (llama-server's ``dry_sequence_breakers``); DRY
needs them as tokens, which takes a pass over the whole vocabulary. The result is kept
per model and per list of breakers, so only the first request with a new list pays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import attrs

from tessera.engine.dry import DryBreakers
from tessera.engine.sampling import SamplerParams
from tessera.plugins.server.state import ServedModel


async def with_dry_breakers(
    samplers: Sequence[SamplerParams], served: ServedModel
) -> list[SamplerParams]:
    """``samplers`` with their breakers in token form where DRY is on."""
    out = []
    for params in samplers:
        if params.dry_multiplier == 0.0 or params.dry_breakers is not None:
            out.append(params)
            continue
        key = ("dry_breakers", params.dry_sequence_breakers)
        breakers = served.extras.get(key)
        if breakers is None:
            # a pass over the vocabulary: seconds for a large one, so off the event loop
            breakers = await asyncio.to_thread(
                DryBreakers.for_tokenizer, params.dry_sequence_breakers, served.tokenizer
            )
            breakers = served.extras.setdefault(key, breakers)
        out.append(attrs.evolve(params, dry_breakers=breakers))
    return out

"""The cases of the backend conformance kit (:mod:`tessera.testing.conformance.kit`), all ops.

Each op family's cases live in a module of their own (:mod:`.matmul`, :mod:`.elementwise`,
:mod:`.norms`, :mod:`.rope`, :mod:`.attention`, :mod:`.transfers`, :mod:`.moe`,
:mod:`.block`); :func:`all_cases` lists them in one fixed order, so case ids and their
order stay stable.

Shapes are small but chosen to reach awkward paths: output rows that are not a multiple
of 16, ubatches of 1 (decode) and 33 rows (prefill), partial rotary dims, grouped-query
ratios 1/2/4, several sequences in one mask, a query with no visible cell, and KV cells
past ``n_kv`` filled with NaN (an op that reads them fails). ``attention_rows`` cases
(an optional op) use real row lists from :meth:`tessera.engine.kv_cache.KVCache.rows`: ragged
sequences, padding, a sequence with nothing to see yet, GQA and a sliding window.
``attention_softcap`` cases are the ``attention`` ones with the scores capped, and again with
attention sinks instead.
"""

from __future__ import annotations

from typing import Any

from tessera.testing.conformance.attention import attention_cases, attention_rows_cases
from tessera.testing.conformance.block import decoder_block_cases
from tessera.testing.conformance.elementwise import (
    concat_cases,
    elementwise_cases,
    swiglu_oai_case,
    tanh_case,
)
from tessera.testing.conformance.kit import Case
from tessera.testing.conformance.kv_store import kv_cache_cases
from tessera.testing.conformance.matmul import (
    gate_up_swiglu_cases,
    linear_cases,
    matmul_cases,
    matmul_heads_cases,
    matmul_n_cases,
)
from tessera.testing.conformance.moe import moe_ffn_cases
from tessera.testing.conformance.norms import norm_cases
from tessera.testing.conformance.recurrent import recurrent_cases
from tessera.testing.conformance.rope import rope_cases, rope_ext_cases
from tessera.testing.conformance.transfers import set_rows_case, transfer_cases


def all_cases(qtypes: list[Any]) -> list[Case]:
    """Every case, the matmul-like ones for each of ``qtypes``, in the order tests collect
    them."""
    return [
        *matmul_cases(qtypes),
        *elementwise_cases(),
        *norm_cases(),
        *rope_cases(),
        *attention_cases(),
        *attention_rows_cases(),
        set_rows_case(),
        *transfer_cases(),
        *rope_ext_cases(),
        tanh_case(),
        *attention_cases("attention_softcap"),
        *moe_ffn_cases(qtypes),
        *linear_cases(qtypes),
        *matmul_n_cases(qtypes),
        *gate_up_swiglu_cases(qtypes),
        *decoder_block_cases(qtypes),
        *concat_cases(),
        *matmul_heads_cases(qtypes),
        *attention_cases("attention_softcap", sinks=True),
        swiglu_oai_case(),
        *kv_cache_cases(),
        *recurrent_cases(),
    ]

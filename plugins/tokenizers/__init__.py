"""Tokenizer kinds beyond the core's: llama.cpp's unigram (``t5``), RWKV and PLaMo-2.

Each kind is registered as a :class:`~tessera.contract.tokenizer_kind.TokenizerKindInfo`;
its module is imported when a vocabulary of that kind is first built, so listing the
plugins stays fast. llama.cpp's defaults for each kind (special ids, BOS/EOS framing) are
declared here with it.
"""

from __future__ import annotations

from typing import Any

from tessera.contract.tokenizer_kind import TokenizerKindInfo, Vocabulary
from tessera.hookspecs import hookimpl
from tessera.text.tokenizer_kinds import byte_token
from tessera.text.vocab import TokenAttr

TESSERA_PLUGIN_API = 2


def _ugm(vocab: Vocabulary) -> Any:
    from tessera.plugins.tokenizers.ugm import UgmModel

    return UgmModel(
        vocab.config, vocab.tokens, vocab.scores, vocab.attrs, vocab.special["unk"], vocab.metadata
    )


def _rwkv(vocab: Vocabulary) -> Any:
    from tessera.plugins.tokenizers.rwkv import RwkvModel

    return RwkvModel(vocab.tokens, vocab.special["unk"])


def _render_rwkv(text: str, attr: int) -> bytes:
    from tessera.plugins.tokenizers.rwkv import unescape_rwkv

    return unescape_rwkv(text)  # every token, special ones included, is stored escaped


def _plamo2(vocab: Vocabulary) -> Any:
    from tessera.plugins.tokenizers.plamo2 import Plamo2Model

    return Plamo2Model(vocab.tokens, vocab.scores, vocab.attrs)


def _render_plamo2(text: str, attr: int) -> bytes:
    # PLaMo-2 stores its tokens as plain text: no ▁ to turn back into spaces
    return byte_token(text) if attr & TokenAttr.BYTE else text.encode()


KINDS = (
    TokenizerKindInfo(
        name="ugm",
        models=("t5",),
        build=_ugm,
        framed=True,
        add_eos=True,
        special_ids={"eos": 1, "unk": 2, "pad": 0},
        description="SentencePiece's unigram model over a precompiled charsmap (T5)",
    ),
    TokenizerKindInfo(
        name="rwkv",
        models=("rwkv",),
        build=_rwkv,
        render=_render_rwkv,
        description="RWKV's greedy longest match over escaped byte tokens",
    ),
    TokenizerKindInfo(
        name="plamo2",
        models=("plamo2",),
        build=_plamo2,
        render=_render_plamo2,
        special_ids={"bos": 1, "eos": 2, "unk": 0, "pad": 3},
        description="PLaMo-2's best segmentation by integer token scores",
    ),
)


@hookimpl
def tessera_register_tokenizer_kinds(register):
    for kind in KINDS:
        register(kind)

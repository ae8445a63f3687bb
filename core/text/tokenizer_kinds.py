"""The tokenizer of a vocabulary's kind, built from it — the core's kinds (SPM, BPE, WPM)
here, any other through its plugin's :class:`~tessera.contract.tokenizer_kind.TokenizerKindInfo`
— and how each kind renders a token back to bytes (llama.cpp's ``token_to_piece``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tessera.contract.tokenizer_kind import VocabModel, Vocabulary
from tessera.text.bpe import CHAR_TO_BYTE, BpeModel, parse_merges
from tessera.text.pre_split import KIMI_K2
from tessera.text.vocab import SPACE_MARKER, SPECIAL, TokenAttr
from tessera.text.vocab_config import VocabConfig
from tessera.text.vocab_models import SpmModel, WpmModel


def build_model(
    config: VocabConfig,
    tokens: Sequence[str],
    ids: Mapping[str, int],
    attrs: Sequence[int],
    special: Mapping[str, int | None],
    metadata: Mapping[str, Any],
) -> VocabModel:
    """The tokenizer ``config.kind`` names, over the vocabulary ``tokens``."""
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    if config.plugin is not None:
        return config.plugin.build(
            Vocabulary(config, tokens, ids, scores, attrs, special, metadata)
        )
    if config.kind == "spm":
        return SpmModel(tokens, ids, scores, special["unk"], config.add_space_prefix)
    if config.kind == "bpe":
        assert config.pre is not None
        merges = parse_merges(
            metadata.get("tokenizer.ggml.merges"), ids, required=config.pre.regexes != (KIMI_K2,)
        )
        bpe = BpeModel(ids, merges, config.pre)
        if config.model == "whitespace":
            from tessera.text.bpe_sessions import WhitespaceModel

            return WhitespaceModel(bpe, config.lowercase)
        if config.model == "hybriddna":
            from tessera.text.bpe_sessions import HybridDnaModel

            return HybridDnaModel(bpe, ids)
        return bpe
    assert config.kind == "wpm", config.kind
    return WpmModel(ids, special["unk"], config.lowercase, config.strip_accents)


def render_token(config: VocabConfig, text: str, attr: int, token_id: int) -> bytes:
    """The bytes of one token, as llama.cpp's ``token_to_piece`` renders it with specials."""
    if config.plugin is not None and config.plugin.render is not None:
        return config.plugin.render(text, attr)
    if attr & SPECIAL:
        return text.encode()
    if attr & TokenAttr.NORMAL:
        if config.kind == "bpe" and config.pre is not None and config.pre.byte_encode:
            return b"".join(
                bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode() for c in text
            )
        if config.kind == "bpe" and not config.escape_whitespaces:
            # the whitespace model's raw text (llama.cpp reads it as byte-level characters
            # and renders what is not one as "[UNK_BYTE_0x..]")
            return text.encode()
        return text.replace(SPACE_MARKER, " ").encode()
    if attr & TokenAttr.BYTE:
        return byte_token(text)
    return b""  # unused and undefined tokens render as nothing


def byte_token(text: str) -> bytes:
    """The byte of a ``<0xXX>`` token (0 when malformed, as C's strtol reads it)."""
    try:
        return bytes([int(text[3:5], 16)])
    except ValueError:
        return b"\0"

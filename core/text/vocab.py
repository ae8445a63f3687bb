"""What llama.cpp derives from a GGUF file's ``tokenizer.*`` vocabulary when it loads it: token
types, special token ids (with its per-model defaults), end-of-generation tokens, and which
special tokens swallow the whitespace around them."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera.errors import TesseraError

SUPPORTED_MODELS = ("gpt2", "llama", "bert")
SPACE_MARKER = "\u2581"  # SentencePiece's "▁"


class TokenizerError(TesseraError):
    """A vocabulary is missing, malformed or of a kind tessera cannot tokenize."""


class TokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# The types llama.cpp caches as special: cut out of raw text before tokenizing, rendered verbatim.
SPECIAL_TYPES = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)

SPECIAL_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic: the key GGUF uses
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
# llama.cpp's default special ids when a file does not name them.
_DEFAULT_IDS: dict[str, dict[str, int]] = {
    "llama": {"bos": 1, "eos": 2, "unk": 0},
    "bert": {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
    "gpt2": {},
}

# Tokens llama.cpp treats as end-of-generation by their text (and forces to control type).
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<｜end▁of▁sentence｜>",
    }
)


def special_ids(
    metadata: Mapping[str, Any], model: str, n_vocab: int, has_bos: bool
) -> dict[str, int | None]:
    """The ids of the tokens named in :data:`SPECIAL_ID_KEYS`: from the metadata, else
    llama.cpp's default for the model; None where there is none or it is outside the vocab."""
    ids: dict[str, int | None] = dict.fromkeys(SPECIAL_ID_KEYS)
    ids.update(_DEFAULT_IDS[model])
    if model == "bert" and "tokenizer.ggml.cls_token_id" in metadata:
        ids["bos"] = metadata["tokenizer.ggml.cls_token_id"]
    for name, key in SPECIAL_ID_KEYS.items():
        if key in metadata:
            ids[name] = int(metadata[key])
    if not has_bos:
        ids["bos"] = None
    return {k: (v if v is not None and 0 <= v < n_vocab else None) for k, v in ids.items()}


def find_eog(
    ids: Mapping[str, int], types: list[int], named: Iterable[int | None]
) -> frozenset[int]:
    """End-of-generation ids: the ``named`` eos/eot/eom ids plus the tokens llama.cpp knows by
    text. Like llama.cpp, this retypes those tokens in ``types``."""
    eog = {i for i in named if i is not None}
    for text in EOG_TEXTS:
        tid = ids.get(text)
        if tid is not None:
            eog.add(tid)
            # llama.cpp overrides a "control-looking" token that was typed normal
            types[tid] = TokenType.CONTROL
    # gpt-oss style vocabularies end a turn with <|return|>/<|call|>; <|end|> is not EOG there
    if {"<|return|>", "<|call|>", "<|end|>"} <= ids.keys():
        end = ids["<|end|>"]
        eog.discard(end)
        types[end] = TokenType.USER_DEFINED
    return frozenset(eog)


def strip_sets(
    ids: Mapping[str, int], types: Sequence[int], metadata: Mapping[str, Any]
) -> tuple[set[int], set[int]]:
    """The special tokens that swallow the whitespace on their left and on their right
    (llama.cpp's per-model LSTRIP/RSTRIP attributes, picked by name, pre-tokenizer and arch)."""
    name = str(metadata.get("general.name", "")).lower()
    pre_name = str(metadata.get("tokenizer.ggml.pre") or "")
    arch = str(metadata.get("general.architecture", ""))
    lstrip: set[int] = set()
    rstrip: set[int] = set()
    if any(s in pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if "<mask>" in ids:
            lstrip.add(ids["<mask>"])
    elif "phi-3" in name or "phi3" in name:
        rstrip = {i for i, t in enumerate(types) if t in SPECIAL_TYPES}
        if "</s>" in ids:
            rstrip.add(ids["</s>"])
        rstrip -= {ids[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in ids}
    elif "modern-bert" in name and "[MASK]" in ids:
        lstrip.add(ids["[MASK]"])
    return lstrip, rstrip

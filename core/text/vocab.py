"""What llama.cpp derives from a GGUF file's ``tokenizer.*`` vocabulary when it loads it: token
attributes, special token ids (with its per-model defaults), end-of-generation tokens, the
tokens it retypes by their text, and which special tokens swallow the whitespace around them."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessera.errors import TokenizerError as TokenizerError  # its home is tessera.errors

SPACE_MARKER = "\u2581"  # SentencePiece's "▁"


class TokenType(enum.IntEnum):
    """``tokenizer.ggml.token_type`` values."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(enum.IntFlag):
    """llama.cpp's per-token attribute bits (a token can carry several)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# Plain ints for the loops over every token (IntFlag arithmetic is slow there).
_CONTROL, _USER_DEFINED, _UNUSED = (
    int(TokenAttr.CONTROL),
    int(TokenAttr.USER_DEFINED),
    int(TokenAttr.UNUSED),
)
#: Attributes of the tokens llama.cpp cuts out of raw text before tokenizing.
SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
#: ... of those only cut out when special tokens are parsed, and hidden when decoding.
HIDDEN = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)

_TYPE_ATTR = {int(t): int(TokenAttr[t.name]) for t in TokenType}
#: ``_TYPE_ATTR`` as a table indexed by type value (0 where a value names no type).
_TYPE_TABLE = np.array([_TYPE_ATTR.get(v, 0) for v in range(max(_TYPE_ATTR) + 1)], np.int64)


def token_attrs(types: Sequence[int] | None, n: int) -> list[int]:
    """The attribute bits of each token from ``tokenizer.ggml.token_type`` (all normal when
    the file has none; an unknown type value is undefined)."""
    if types is None:
        return [int(TokenAttr.NORMAL)] * n
    values = np.asarray(types[:n], dtype=np.int64)
    known = (values >= 0) & (values < len(_TYPE_TABLE))
    return np.where(known, _TYPE_TABLE[np.where(known, values, 0)], 0).tolist()


ID_KEYS = {
    "bos": ("tokenizer.ggml.bos_token_id",),
    "eos": ("tokenizer.ggml.eos_token_id",),
    "eot": ("tokenizer.ggml.eot_token_id",),
    "eom": ("tokenizer.ggml.eom_token_id",),
    "unk": ("tokenizer.ggml.unknown_token_id",),
    "sep": ("tokenizer.ggml.seperator_token_id",),  # sic: the key GGUF uses
    "pad": ("tokenizer.ggml.padding_token_id",),
    "mask": ("tokenizer.ggml.mask_token_id",),
    # llama.cpp reads the deprecated keys after the current ones
    "fim_pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "fim_suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "fim_mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "fim_pad": ("tokenizer.ggml.fim_pad_token_id",),
    "fim_rep": ("tokenizer.ggml.fim_rep_token_id",),
    "fim_sep": ("tokenizer.ggml.fim_sep_token_id",),
}
SPECIAL_ID_KEYS = {name: keys[0] for name, keys in ID_KEYS.items()}
_BPE_IDS = {"bos": 11, "eos": 11}
# llama.cpp's default special ids per tokenizer model when a file does not name them (a
# plugin's kind declares its own: TokenizerKindInfo.special_ids).
DEFAULT_IDS: dict[str, dict[str, int]] = {
    "llama": {"bos": 1, "eos": 2, "unk": 0},
    "bert": {"bos": 101, "unk": 100, "sep": 102, "pad": 0, "mask": 103},
    "gpt2": _BPE_IDS,
    "hybriddna": _BPE_IDS,
    "whitespace": _BPE_IDS,
    "gemma4": {},
}


def special_ids(
    metadata: Mapping[str, Any],
    defaults: Mapping[str, int],
    n_vocab: int,
    default_bos: bool = True,
) -> dict[str, int | None]:
    """The ids of the tokens named in :data:`ID_KEYS`: llama.cpp's ``defaults`` for the
    model (when inside the vocabulary), replaced by each metadata key that is inside it."""
    ids: dict[str, int | None] = dict.fromkeys(ID_KEYS)
    ids.update(defaults)
    if not default_bos:
        ids["bos"] = None
    for name, keys in ID_KEYS.items():
        if ids[name] is not None and not 0 <= ids[name] < n_vocab:  # type: ignore[operator]
            ids[name] = None
        for key in keys:
            if key in metadata and 0 <= int(metadata[key]) < n_vocab:
                ids[name] = int(metadata[key])
    return ids


# Tokens llama.cpp finds by their text when the file names no id for the role, and forces to
# control tokens. When a vocabulary has several, llama.cpp takes whichever its hash map
# yields first; tessera takes the first of this list.
_ROLE_TEXTS = {
    "eot": "<|eot_id|> <|im_end|> <|end|> <end_of_turn> <|endoftext|> <|end_of_text|> <EOT> "
    "_<EOT> [EOT] <｜end▁of▁sentence｜> <end_of_utterance>",
    "eom": "<|eom_id|>",
    "fim_pre": "<|fim_prefix|> <fim-prefix> <fim_prefix> <｜fim▁begin｜> <PRE> ▁<PRE> "
    "<|code_prefix|> <|prefix|>",
    "fim_suf": "<|fim_suffix|> <fim-suffix> <fim_suffix> <｜fim▁hole｜> <SUF> ▁<SUF> "
    "<|code_suffix|> <|suffix|>",
    "fim_mid": "<|fim_middle|> <fim-middle> <fim_middle> <｜fim▁end｜> <MID> ▁<MID> "
    "<|code_middle|> <|middle|>",
    "fim_pad": "<|fim_pad|> <fim-pad> <fim_pad> <PAD> [PAD]",
    "fim_rep": "<|fim_repo|> <|repo_name|> <fim-repo> <REPO> <reponame>",
    "fim_sep": "<|file_sep|>",
}
# Tokens llama.cpp treats as end-of-generation by their text (and forces to control).
EOG_TEXTS = frozenset(
    "<|eot_id|> <|im_end|> <|end|> <|return|> <|call|> <|flush|> <|calls|> <end_of_turn> "
    "<|endoftext|> </s> <|eom_id|> <EOT> _<EOT> [EOT] [EOS] <|end_of_text|> <end_of_utterance> "
    "<eos> <turn|> <|tool_response> <｜end▁of▁sentence｜> [e~[".split()
)
# gpt-oss: llama.cpp always renders these, so they are cut out even without parse_special.
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def apply_load_rules(
    tokens: Sequence[str],
    token_ids: Mapping[str, int],
    attrs: list[int],
    ids: dict[str, int | None],
) -> frozenset[int]:
    """llama.cpp's retyping of tokens by their text; returns the end-of-generation ids.

    Fills the roles of :data:`_ROLE_TEXTS` the file left empty (in ``ids``) and updates
    ``attrs`` in place as llama.cpp does when it loads the vocabulary.
    """
    for role, texts in _ROLE_TEXTS.items():
        if ids[role] is None:
            found = [token_ids[t] for t in texts.split() if t in token_ids]
            if found:
                ids[role] = found[0]
                attrs[found[0]] |= _CONTROL
    for tid in np.flatnonzero(np.asarray(attrs, dtype=np.int64) & _CONTROL).tolist():
        if "unused" in tokens[tid]:
            attrs[tid] |= _UNUSED
    eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if ids[r] is not None}
    for text in EOG_TEXTS & token_ids.keys():
        eog.add(token_ids[text])
        attrs[token_ids[text]] |= _CONTROL
    for text in _ALWAYS_USER_DEFINED:
        if text in token_ids:
            attrs[token_ids[text]] = _USER_DEFINED
    eog |= {ids[r] for r in ("eos", "eot", "eom") if ids[r] is not None}
    by_text = {tokens[t]: t for t in eog}
    # o200k_harmony and solar-open end a turn with <|return|>/<|call|>: <|end|> is not EOG
    if "<|end|>" in by_text and (
        {"<|return|>", "<|call|>"} <= by_text.keys() or {"<|calls|>", "<|flush|>"} <= by_text.keys()
    ):
        eog.discard(by_text["<|end|>"])
        attrs[by_text["<|end|>"]] = _USER_DEFINED
    # Gemma 4 and PLaMo have a normal </s>
    if "</s>" in by_text and by_text.keys() & {"<|tool_response>", "<|plamo:eos|>"}:
        eog.discard(by_text["</s>"])
        attrs[by_text["</s>"]] = int(TokenAttr.NORMAL)
    return frozenset(eog)


def apply_strip_attrs(
    token_ids: Mapping[str, int], attrs: list[int], metadata: Mapping[str, Any]
) -> None:
    """The special tokens that swallow the whitespace on their left (LSTRIP) or right
    (RSTRIP): llama.cpp's per-model rules, picked by name, pre-tokenizer and arch."""
    name = str(metadata.get("general.name", "")).lower()
    pre_name = str(metadata.get("tokenizer.ggml.pre") or "")
    arch = str(metadata.get("general.architecture", ""))

    def set_attr(text: str, bit: TokenAttr, on: bool = True) -> None:
        if text in token_ids:
            tid = token_ids[text]
            attrs[tid] = (attrs[tid] | int(bit)) if on else (attrs[tid] & ~int(bit))

    if any(s in pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", TokenAttr.LSTRIP)
    elif "phi-3" in name or "phi3" in name:
        rstrip = int(TokenAttr.RSTRIP)
        for tid, attr in enumerate(attrs):
            if attr & SPECIAL:
                attrs[tid] |= rstrip
        set_attr("</s>", TokenAttr.RSTRIP)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, TokenAttr.RSTRIP, on=False)
    elif "modern-bert" in name:
        set_attr("[MASK]", TokenAttr.LSTRIP)

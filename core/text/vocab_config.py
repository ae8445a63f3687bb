"""The tokenizer flags llama.cpp derives from a vocabulary's metadata when it loads it: the
kind of tokenizer, its pre-tokenizer, and the per-kind defaults of every ``tokenizer.ggml.*``
flag, overridden by the keys the file sets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.text.pre import PreTokenizer, pick_pre_tokenizer
from tessera.text.vocab import TokenizerError

#: ``tokenizer.ggml.model`` values -> the kind of tokenizer llama.cpp runs for them.
KINDS = {
    "llama": "spm",
    "gpt2": "bpe",
    "hybriddna": "bpe",
    "whitespace": "bpe",
    "gemma4": "bpe",
    "bert": "wpm",
    "t5": "ugm",
    "rwkv": "rwkv",
    "plamo2": "plamo2",
}
_NO_VOCAB = ("no_vocab", "none")


@attrs.frozen
class VocabConfig:
    """What the tokenizer needs to know about a vocabulary beyond its tokens."""

    model: str  # tokenizer.ggml.model
    kind: str  # spm, bpe, wpm, ugm, rwkv, plamo2
    pre: PreTokenizer | None  # BPE kinds only
    add_space_prefix: bool
    remove_extra_whitespaces: bool
    escape_whitespaces: bool
    add_bos: bool
    add_eos: bool
    add_sep: bool
    lowercase: bool
    strip_accents: bool


def vocab_config(metadata: Mapping[str, Any]) -> VocabConfig:
    """The flags llama.cpp sets for the vocabulary ``metadata`` describes."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None or metadata.get("tokenizer.ggml.tokens") is None:
        raise TokenizerError(
            "the model has no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens "
            "metadata); use a GGUF converted with its vocabulary or pass a tokenizer folder"
        )
    if model in _NO_VOCAB:
        raise TokenizerError(
            f"the model's vocabulary is '{model}': it has no tokenizer; pass token ids, or "
            "use a GGUF converted with its vocabulary"
        )
    kind = KINDS.get(model)
    if kind is None:
        raise TokenizerError(
            f"tokenizer model '{model}' is not supported (supported: {', '.join(KINDS)}); "
            "use a model with one of those vocabularies"
        )
    pre = None
    if kind == "bpe":
        name = "gemma4" if model == "gemma4" else metadata.get("tokenizer.ggml.pre")
        pre = pick_pre_tokenizer(name)
    defaults = {
        "spm": dict(add_space_prefix=True, add_bos=True),
        "wpm": dict(add_bos=True, add_sep=True),
        "ugm": dict(add_eos=True),
    }.get(kind, {})
    if pre is not None:
        defaults = dict(add_bos=pre.add_bos, add_sep=pre.add_sep)
    lowercase = _flag(
        metadata,
        "normalizer.lowercase",
        pre.lowercase if pre is not None and pre.lowercase is not None else True,
    )
    add_bos = _flag(metadata, "add_bos_token", defaults.get("add_bos", False))
    return VocabConfig(
        model=model,
        kind=kind,
        pre=pre,
        add_space_prefix=_flag(metadata, "add_space_prefix", defaults.get("add_space_prefix")),
        remove_extra_whitespaces=_flag(metadata, "remove_extra_whitespaces", False),
        escape_whitespaces=pre.escape_whitespaces if pre is not None else True,
        # llama.cpp always adds BOS for Gemma 4's vocabulary, whatever the file says
        add_bos=add_bos or (pre is not None and pre.newline_tokens),
        add_eos=_flag(metadata, "add_eos_token", defaults.get("add_eos", False)),
        add_sep=_flag(metadata, "add_sep_token", defaults.get("add_sep", False)),
        lowercase=lowercase,
        strip_accents=_flag(metadata, "normalizer.strip_accents", lowercase),
    )


def _flag(metadata: Mapping[str, Any], key: str, default: bool | None) -> bool:
    return bool(metadata.get(f"tokenizer.ggml.{key}", default or False))

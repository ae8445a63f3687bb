"""The tokenizer flags llama.cpp derives from a vocabulary's metadata when it loads it: the
kind of tokenizer (the core's, or a tokenizer-kind plugin's), its pre-tokenizer, and the
per-kind defaults of every ``tokenizer.ggml.*`` flag, overridden by the keys the file sets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.contract.tokenizer_kind import TokenizerKindInfo
from tessera.text.pre import PreTokenizer, pick_pre_tokenizer
from tessera.text.vocab import TokenizerError

#: ``tokenizer.ggml.model`` values -> the kind of tokenizer the core runs for them.
KINDS = {
    "llama": "spm",
    "gpt2": "bpe",
    "hybriddna": "bpe",
    "whitespace": "bpe",
    "gemma4": "bpe",
    "bert": "wpm",
}
#: ``tokenizer.ggml.model`` values a built-in tokenizer-kind plugin runs, and its entry point
#: (named when it is not loaded).
PLUGIN_MODELS = {"t5": "tokenizers", "rwkv": "tokenizers", "plamo2": "tokenizers"}
_NO_VOCAB = ("no_vocab", "none")


@attrs.frozen
class VocabConfig:
    """What the tokenizer needs to know about a vocabulary beyond its tokens."""

    model: str  # tokenizer.ggml.model
    kind: str  # spm, bpe, wpm, or a plugin's kind (ugm, rwkv, plamo2 ...)
    pre: PreTokenizer | None  # BPE kinds only
    add_space_prefix: bool
    remove_extra_whitespaces: bool
    escape_whitespaces: bool
    add_bos: bool
    add_eos: bool
    add_sep: bool
    lowercase: bool
    strip_accents: bool
    #: The plugin's kind that runs the vocabulary (None: one of the core's).
    plugin: TokenizerKindInfo | None = attrs.field(default=None, eq=False)


def vocab_config(metadata: Mapping[str, Any], runtime: Any = None) -> VocabConfig:
    """The flags llama.cpp sets for the vocabulary ``metadata`` describes. A kind the core
    does not run is looked up in ``runtime``'s tokenizer kinds (none without a runtime)."""
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
    plugin = None if model in KINDS else plugin_kind(model, runtime)
    kind = KINDS[model] if plugin is None else plugin.name
    pre = None
    if kind == "bpe":
        name = "gemma4" if model == "gemma4" else metadata.get("tokenizer.ggml.pre")
        pre = pick_pre_tokenizer(name)
    defaults = {
        "spm": dict(add_space_prefix=True, add_bos=True),
        "wpm": dict(add_bos=True, add_sep=True),
    }.get(kind, {})
    if plugin is not None:
        defaults = dict(add_bos=plugin.add_bos, add_eos=plugin.add_eos)
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
        plugin=plugin,
    )


def plugin_kind(model: str, runtime: Any) -> TokenizerKindInfo:
    """The plugin's tokenizer kind that runs ``model``, or a TokenizerError naming the
    plugin to enable (for a built-in plugin's model) or what is installed."""
    if runtime is not None and (model not in PLUGIN_MODELS or model in tokenizer_kinds(runtime)):
        return runtime.get("tokenizer_kind", model, where=", ".join(KINDS))
    if model in PLUGIN_MODELS:
        plugin = PLUGIN_MODELS[model]
        raise TokenizerError(
            f"tokenizer model '{model}' is run by the plugin '{plugin}', which is not loaded; "
            f"enable it (check --disable-plugins, TESSERA_DISABLE_PLUGINS and TESSERA_PLUGINS) "
            "or reinstall tessera"
        )
    raise TokenizerError(
        f"tokenizer model '{model}' is not supported (supported: {', '.join(KINDS)}); "
        "use a model with one of those vocabularies"
    )


def tokenizer_kinds(runtime: Any) -> dict[str, TokenizerKindInfo]:
    """The plugins' tokenizer kinds by ``tokenizer.ggml.model`` value."""
    return runtime.catalogue("tokenizer_kind")


def _flag(metadata: Mapping[str, Any], key: str, default: bool | None) -> bool:
    return bool(metadata.get(f"tokenizer.ggml.{key}", default or False))

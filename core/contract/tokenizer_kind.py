"""What a tokenizer-kind plugin registers: a tokenizer for vocabularies the core does not run.

The core runs SentencePiece-style BPE (``llama``), the BPE kinds after a pre-tokenizer
(``gpt2`` ...) and WordPiece (``bert``). A plugin adds another kind (llama.cpp's unigram
``t5``, ``rwkv``, ``plamo2`` ...) by registering a :class:`TokenizerKindInfo` through the
``tessera_register_tokenizer_kinds`` hook. The tokenizer keeps llama.cpp's rules around
every kind (special tokens cut out first, BOS/EOS added, decoding by token pieces); the
kind only turns raw text into ids and, when it stores tokens its own way, renders one back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from tessera.text.vocab_config import VocabConfig


class VocabModel(Protocol):
    """One kind of tokenizer: raw text (special tokens already cut out) to ids."""

    def encode(self, text: str, after_special: bool) -> list[int]:
        """The ids of ``text``; ``after_special`` says it starts the text or follows a
        special token (SentencePiece then prefixes a space)."""
        ...


@attrs.frozen
class Vocabulary:
    """A GGUF vocabulary as the tokenizer has read it, handed to a kind's ``build``."""

    config: VocabConfig  # the tokenizer.ggml.* flags, with their per-kind defaults
    tokens: Sequence[str]  # token texts by id (empty ones already named)
    ids: Mapping[str, int]  # token text -> id (the first of equal texts)
    scores: Sequence[float]  # tokenizer.ggml.scores (zeros when the file has none)
    attrs: Sequence[int]  # llama.cpp's token attributes (tessera.text.vocab.TokenAttr)
    special: Mapping[str, int | None]  # "bos", "eos", "unk" ... -> id
    metadata: Mapping[str, Any] = attrs.field(repr=False)  # every tokenizer.* key


@attrs.frozen
class TokenizerKindInfo:
    """A kind of tokenizer and the ``tokenizer.ggml.model`` values it runs."""

    name: str  # the kind, as llama.cpp names it: "ugm", "rwkv", "plamo2"
    models: tuple[str, ...]  # the tokenizer.ggml.model values: ("t5",)
    #: The kind's tokenizer over one vocabulary; raise TokenizerError when it is unusable.
    build: Callable[[Vocabulary], VocabModel] = attrs.field(eq=False)
    #: ``render(text, attr) -> bytes``: one token's bytes (llama.cpp's token_to_piece), for
    #: kinds that store tokens escaped or as raw bytes; None renders them as SentencePiece
    #: does (``▁`` is a space, ``<0xXX>`` a byte, unused tokens nothing).
    render: Callable[[str, int], bytes] | None = attrs.field(default=None, eq=False)
    #: Whether encode adds BOS/EOS as the add_bos/add_eos flags say (llama.cpp frames the
    #: SPM, BPE and UGM kinds only).
    framed: bool = False
    #: The add_bos/add_eos flags when the file does not set them.
    add_bos: bool = False
    add_eos: bool = False
    #: Special token ids when the file does not name them ("bos", "eos", "unk", "pad" ...).
    special_ids: Mapping[str, int] = attrs.field(factory=dict, eq=False)
    description: str = ""

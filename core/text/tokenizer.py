"""Text <-> token ids, exactly as llama.cpp computes them, for GGUF and Hugging Face vocabularies.

A GGUF file carries its vocabulary as ``tokenizer.*`` metadata. :class:`Tokenizer` rebuilds the
tokenizer it names — SentencePiece-style BPE over scores (``llama``), BPE after a pre-tokenizer
split (``gpt2`` and the other BPE kinds), WordPiece (``bert``), or a tokenizer-kind plugin's
(Unigram ``t5``, RWKV's greedy trie, PLaMo-2's table) — and applies llama.cpp's rules around
it: special tokens are cut out of the text first (longest first; control tokens only when
asked), and BOS/EOS/SEP are added as llama.cpp adds them for that kind.

Decoding joins each token's bytes (llama.cpp's ``token_to_piece``) and drops the one prefix space
the encoder added; llama.cpp's optional "clean spaces" rewrite of BPE output (removing the space
before ``.`` or ``'s``) is not applied, so decoding stays lossless where encoding is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tessera.text.bpe_sessions import DNA_KMER_MARKER
from tessera.text.hf_tokenizer import hf_dir_metadata
from tessera.text.pre import PreTokenizer
from tessera.text.special_tokens import SpecialTokens
from tessera.text.stream import StreamDecoder
from tessera.text.tokenizer_kinds import build_model, render_token
from tessera.text.vocab import (
    DEFAULT_IDS,
    HIDDEN,
    TokenAttr,
    TokenizerError,
    TokenType,
    apply_load_rules,
    apply_strip_attrs,
    special_ids,
    token_attrs,
)
from tessera.text.vocab_config import vocab_config

__all__ = ["Tokenizer", "TokenizerError", "TokenType"]

_C_SPACE = " \t\n\v\f\r"  # what C's isspace() strips around lstrip/rstrip special tokens
# The core kinds whose encode llama.cpp frames with BOS/EOS (WPM always adds BOS and SEP
# instead); a plugin's kind says it in TokenizerKindInfo.framed.
_FRAMED = ("spm", "bpe")


class Tokenizer:
    """A vocabulary with llama.cpp's encode/decode rules; build it with a ``from_*`` method.

    ``runtime`` (a :class:`tessera.plugin_manager.Runtime`) provides the plugins' tokenizer
    kinds; without it only the core's kinds are run."""

    def __init__(self, metadata: Mapping[str, Any], runtime: Any = None) -> None:
        self._meta = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
        config = vocab_config(metadata, runtime)
        self.config = config
        self.model: str = config.model
        self._tokens = list(metadata["tokenizer.ggml.tokens"])
        if not all(self._tokens):  # llama.cpp names empty tokens so that every token has a text
            self._tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(self._tokens)]
        n = len(self._tokens)
        # llama.cpp rejects duplicates; keep the first (the last write of the reversed pairs)
        self._ids: dict[str, int] = dict(
            zip(reversed(self._tokens), range(n - 1, -1, -1), strict=True)
        )
        if config.model == "hybriddna" and "<oov>" in self._ids:
            # the k-mers after <oov> render without the marker that keeps their ids apart
            for i in range(self._ids["<oov>"] + 1, n):
                if len(self._tokens[i]) > 1 and self._tokens[i].endswith(DNA_KMER_MARKER):
                    self._tokens[i] = self._tokens[i][:-1]
        self._attrs = token_attrs(metadata.get("tokenizer.ggml.token_type"), n)
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        self.add_space_prefix = config.add_space_prefix
        self.pre: PreTokenizer | None = config.pre
        defaults = DEFAULT_IDS[config.model] if config.plugin is None else config.plugin.special_ids
        ids = special_ids(
            metadata, defaults, n, default_bos=config.pre is None or config.pre.has_bos
        )
        self.eog_ids = apply_load_rules(self._tokens, self._ids, self._attrs, ids)
        self.special = ids
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.eot_id: int | None = ids["eot"]
        self.eom_id: int | None = ids["eom"]
        self.unk_id: int | None = ids["unk"]
        self.sep_id: int | None = ids["sep"]
        self.pad_id: int | None = ids["pad"]
        self.mask_id: int | None = ids["mask"]
        self.add_bos, self.add_eos, self.add_sep = config.add_bos, config.add_eos, config.add_sep
        framed = config.kind in _FRAMED or (config.plugin is not None and config.plugin.framed)
        self._bos_on_encode = (
            self.bos_id if config.kind == "wpm" or (framed and self.add_bos) else None
        )
        self._eos_on_encode = self.eos_id if framed and self.add_eos else None
        self._sep_on_encode = self.sep_id if config.kind == "wpm" else None
        for needed, tid, what in (
            (config.kind == "wpm" or (framed and self.add_bos), self.bos_id, "BOS"),
            (framed and self.add_eos, self.eos_id, "EOS"),
            (config.kind == "wpm", self.sep_id, "SEP"),
        ):
            if needed and tid is None:
                raise TokenizerError(
                    f"the vocabulary asks for a {what} token but names none; fix the "
                    f"tokenizer.ggml.add_*_token / *_token_id metadata"
                )
        # Tokens cut out of raw text before the model runs: longest first, as llama.cpp does.
        self._specials = SpecialTokens(self._tokens, self._attrs)
        apply_strip_attrs(self._ids, self._attrs, metadata)
        self._model = build_model(config, self._tokens, self._ids, self._attrs, ids, metadata)
        self._piece_cache: dict[int, bytes] = {}

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], runtime: Any = None) -> Tokenizer:
        """Build the tokenizer a GGUF file describes (its ``tokenizer.*`` metadata)."""
        return cls(metadata, runtime)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Build the tokenizer of a Hugging Face folder (tokenizer.json + tokenizer_config.json)."""
        return cls(hf_dir_metadata(Path(path)))

    @classmethod
    def from_path(cls, path: str | os.PathLike[str], runtime: Any = None) -> Tokenizer:
        """The tokenizer of a GGUF file (vocab-only files work) or a Hugging Face folder."""
        from tessera.files.gguf import read_gguf

        path = Path(path)
        if path.is_dir():
            return cls.from_hf_dir(path)
        return cls.from_gguf_metadata(read_gguf(path).metadata, runtime)

    # -- properties -------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def token_type(self, token_id: int) -> TokenType:
        """The token's type after llama.cpp's retyping (a control token wins over the rest)."""
        attr = self._attrs[token_id]
        for bit, kind in _ATTR_TYPES:
            if attr & bit:
                return kind
        return TokenType.UNUSED

    def token_attr(self, token_id: int) -> TokenAttr:
        """llama.cpp's attribute bits of the token, after its retyping on load."""
        return TokenAttr(self._attrs[token_id])

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it (``▁``, byte-level characters and all)."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled ``text`` in the vocabulary, or None."""
        return self._ids.get(text)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_special(self, token_id: int) -> bool:
        """Control and unknown tokens: hidden by ``decode(skip_special=True)``."""
        return bool(self._attrs[token_id] & HIDDEN)

    def gguf_metadata(self) -> dict[str, Any]:
        """The ``tokenizer.*`` GGUF keys that describe this tokenizer."""
        return dict(self._meta)

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; BOS/EOS/SEP are added as llama.cpp adds them if add_special."""
        out: list[int] = []
        if add_special and self._bos_on_encode is not None:
            out.append(self._bos_on_encode)
        after_special = True  # SentencePiece prefixes a space at the start and after specials
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            else:
                out += self._model.encode(frag, after_special)
                after_special = False
        if add_special and self._eos_on_encode is not None:
            out.append(self._eos_on_encode)
        if add_special and self._sep_on_encode is not None:
            out.append(self._sep_on_encode)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of the text: a list of raw-text pieces and token ids."""
        frags: list[str | int] = [text] if text else []
        for tid in self._specials.in_text(text) if text else ():
            attr = self._attrs[tid]
            if not parse_special and attr & HIDDEN:
                continue  # control/unknown tokens are plain text unless parse_special
            tok = self._tokens[tid]
            if tok not in text:
                continue
            lstrip, rstrip = attr & TokenAttr.LSTRIP, attr & TokenAttr.RSTRIP
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(tok)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tid)
                        if rstrip:
                            part = part.lstrip(_C_SPACE)
                    if lstrip and k < len(parts) - 1:
                        part = part.rstrip(_C_SPACE)
                    if part:
                        new.append(part)
            frags = new
        return frags

    # -- decoding ---------------------------------------------------------------------------

    def token_to_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (llama.cpp's token_to_piece with special=true)."""
        piece = self._piece_cache.get(token_id)
        if piece is None:
            if not 0 <= token_id < len(self._tokens):
                raise TokenizerError(
                    f"token id {token_id} is outside the vocabulary (0..{len(self._tokens) - 1}); "
                    "pass ids produced by this model's tokenizer"
                )
            piece = self._piece_cache[token_id] = render_token(
                self.config, self._tokens[token_id], self._attrs[token_id], token_id
            )
        return piece

    def token_to_piece(self, token_id: int) -> str:
        """The text of one token (a lone byte of a multi-byte character shows as U+FFFD)."""
        return self.token_to_bytes(token_id).decode("utf-8", errors="replace")

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of a sequence of ids; ``skip_special`` hides control and unknown tokens."""
        stream = StreamDecoder(self, skip_special=skip_special)
        return "".join(stream.feed(i) for i in ids) + stream.flush()

    @property
    def _strips_prefix_space(self) -> bool:
        # The space the encoder put before the first word is not part of the text.
        return self.add_space_prefix or self.config.kind == "wpm"


_ATTR_TYPES = (
    (TokenAttr.CONTROL, TokenType.CONTROL),
    (TokenAttr.USER_DEFINED, TokenType.USER_DEFINED),
    (TokenAttr.UNKNOWN, TokenType.UNKNOWN),
    (TokenAttr.BYTE, TokenType.BYTE),
    (TokenAttr.NORMAL, TokenType.NORMAL),
)

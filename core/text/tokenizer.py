"""Text <-> token ids, exactly as llama.cpp computes them, for GGUF and Hugging Face vocabularies.

A GGUF file carries its vocabulary as ``tokenizer.*`` metadata. :class:`Tokenizer` rebuilds the
model it names with the HF ``tokenizers`` library — byte-level BPE (``gpt2``), SentencePiece-style
BPE over scores (``llama``) or WordPiece (``bert``) — and applies llama.cpp's rules around it:
special tokens are cut out of the text first (longest first; control tokens only when asked),
SentencePiece text gets the ``▁`` space marker and a prefix space after every special token,
byte-level BPE text is pre-split by the regexes llama.cpp picks from ``tokenizer.ggml.pre``, and
BERT text is normalized the way llama.cpp's WPM tokenizer does it.

Decoding joins each token's bytes (llama.cpp's ``token_to_piece``) and drops the one prefix space
the encoder added; llama.cpp's optional "clean spaces" rewrite of BPE output (removing the space
before ``.`` or ``'s``) is not applied, so decoding stays lossless where encoding is.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tessera.text.hf_tokenizer import hf_dir_metadata
from tessera.text.pre import PreTokenizer, pick_pre_tokenizer
from tessera.text.stream import StreamDecoder
from tessera.text.vocab import (
    SPACE_MARKER,
    SPECIAL_TYPES,
    SUPPORTED_MODELS,
    TokenizerError,
    TokenType,
    find_eog,
    special_ids,
    strip_sets,
)
from tessera.text.vocab_models import CHAR_TO_BYTE, byte_level_bpe, spm_bpe, wordpiece, wpm_words

__all__ = ["Tokenizer", "TokenizerError", "TokenType"]

_C_SPACE = " \t\n\v\f\r"  # what C's isspace() strips around lstrip/rstrip special tokens


class Tokenizer:
    """A vocabulary with llama.cpp's encode/decode rules; build it with a ``from_*`` method."""

    def __init__(self, metadata: Mapping[str, Any]) -> None:
        self._meta = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
        model = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if model is None or tokens is None:
            raise TokenizerError(
                "the model has no tokenizer (no tokenizer.ggml.model / tokenizer.ggml.tokens "
                "metadata); use a GGUF converted with its vocabulary or pass a tokenizer folder"
            )
        if model not in SUPPORTED_MODELS:
            raise TokenizerError(
                f"tokenizer model '{model}' is not supported (supported: "
                f"{', '.join(SUPPORTED_MODELS)}); use a model with one of those vocabularies"
            )
        self.model: str = model
        self._tokens: list[str] = list(tokens)
        n = len(self._tokens)
        types = metadata.get("tokenizer.ggml.token_type") or [TokenType.NORMAL] * n
        self._types: list[int] = [int(t) for t in types[:n]]
        self._ids: dict[str, int] = {}
        for i, text in enumerate(self._tokens):
            self._ids.setdefault(text, i)  # llama.cpp rejects duplicates; keep the first
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        self.add_space_prefix = bool(
            metadata.get("tokenizer.ggml.add_space_prefix", model == "llama")
        )
        self.pre: PreTokenizer | None = (
            pick_pre_tokenizer(metadata.get("tokenizer.ggml.pre")) if model == "gpt2" else None
        )
        special = special_ids(metadata, model, n, has_bos=self.pre is None or self.pre.has_bos)
        self.bos_id: int | None = special["bos"]
        self.eos_id: int | None = special["eos"]
        self.eot_id: int | None = special["eot"]
        self.eom_id: int | None = special["eom"]
        self.unk_id: int | None = special["unk"]
        self.sep_id: int | None = special["sep"]
        self.pad_id: int | None = special["pad"]
        self.mask_id: int | None = special["mask"]
        self.add_bos = bool(
            metadata.get(
                "tokenizer.ggml.add_bos_token",
                model in ("llama", "bert") or (self.pre is not None and self.pre.add_bos),
            )
        )
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.add_sep = bool(metadata.get("tokenizer.ggml.add_sep_token", model == "bert"))
        for flag, tid, what in (
            (self.add_bos, self.bos_id, "BOS"),
            (self.add_eos, self.eos_id, "EOS"),
            (self.add_sep, self.sep_id, "SEP"),
        ):
            if flag and tid is None:
                raise TokenizerError(
                    f"the vocabulary asks for a {what} token but names none; fix the "
                    f"tokenizer.ggml.add_*_token / *_token_id metadata"
                )
        self._wpm_lowercase = bool(metadata.get("tokenizer.ggml.normalizer.lowercase", True))
        self._wpm_strip_accents = bool(
            metadata.get("tokenizer.ggml.normalizer.strip_accents", self._wpm_lowercase)
        )
        self.eog_ids = find_eog(self._ids, self._types, (self.eos_id, self.eot_id, self.eom_id))
        self._lstrip, self._rstrip = strip_sets(self._ids, self._types, metadata)
        # Tokens cut out of raw text before the model runs: longest first, as llama.cpp does.
        self._cut_order = sorted(
            (i for i in range(n) if self._types[i] in SPECIAL_TYPES),
            key=lambda i: (-len(self._tokens[i].encode()), i),
        )
        self._hf = self._build_model(metadata)
        self._piece_cache: dict[int, bytes] = {}

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer a GGUF file describes (its ``tokenizer.*`` metadata)."""
        return cls(metadata)

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Build the tokenizer of a Hugging Face folder (tokenizer.json + tokenizer_config.json)."""
        return cls(hf_dir_metadata(Path(path)))

    @classmethod
    def from_path(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer of a GGUF file (vocab-only files work) or a Hugging Face folder."""
        from tessera.files.gguf import read_gguf

        path = Path(path)
        if path.is_dir():
            return cls.from_hf_dir(path)
        return cls.from_gguf_metadata(read_gguf(path).metadata)

    def _build_model(self, metadata: Mapping[str, Any]) -> Any:
        if self.model == "gpt2":
            assert self.pre is not None
            return byte_level_bpe(self._ids, metadata.get("tokenizer.ggml.merges"), self.pre)
        if self.model == "llama":
            scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(self._tokens)
            return spm_bpe(self._tokens, self._ids, scores, self.unk_id)
        return wordpiece(self._ids, self.unk_id)

    # -- properties -------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    def token_type(self, token_id: int) -> TokenType:
        return TokenType(self._types[token_id])

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
        return self._types[token_id] in (TokenType.CONTROL, TokenType.UNKNOWN)

    def gguf_metadata(self) -> dict[str, Any]:
        """The ``tokenizer.*`` GGUF keys that describe this tokenizer."""
        return dict(self._meta)

    # -- encoding ---------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; BOS/EOS/SEP are added per the model's flags if add_special."""
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        prev_special = True  # SentencePiece prefixes a space at the start and after specials
        for frag in self._partition(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if self.model == "llama":
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                out += self._hf.encode(
                    frag.replace(" ", SPACE_MARKER), add_special_tokens=False
                ).ids
            elif self.model == "gpt2":
                out += self._hf.encode(frag, add_special_tokens=False).ids
            else:
                words = wpm_words(frag, self._wpm_lowercase, self._wpm_strip_accents)
                if words:
                    out += self._hf.encode(
                        words, is_pretokenized=True, add_special_tokens=False
                    ).ids
            prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        if add_special and self.add_sep:
            out.append(self.sep_id)  # type: ignore[arg-type]
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of the text: a list of raw-text pieces and token ids."""
        frags: list[str | int] = [text] if text else []
        for tid in self._cut_order:
            if not parse_special and self._types[tid] != TokenType.USER_DEFINED:
                continue  # control/unknown tokens are plain text unless parse_special
            tok = self._tokens[tid]
            if tok not in text:
                continue
            lstrip, rstrip = tid in self._lstrip, tid in self._rstrip
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
            piece = self._piece_cache[token_id] = self._render(token_id)
        return piece

    def _render(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._tokens):
            raise TokenizerError(
                f"token id {token_id} is outside the vocabulary (0..{len(self._tokens) - 1}); "
                "pass ids produced by this model's tokenizer"
            )
        text, kind = self._tokens[token_id], self._types[token_id]
        if kind in SPECIAL_TYPES:
            return text.encode()
        if kind == TokenType.BYTE and text.startswith("<0x") and len(text) == 6:
            return bytes([int(text[3:5], 16)])
        if self.model == "gpt2":
            return b"".join(
                bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode() for c in text
            )
        return text.replace(SPACE_MARKER, " ").encode()

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
        return (self.model == "llama" and self.add_space_prefix) or self.model == "bert"

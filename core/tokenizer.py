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

import codecs
import enum
import json
import logging
import os
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tessera.errors import TesseraError

log = logging.getLogger(__name__)

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

# -- pre-tokenizer regexes, per tokenizer.ggml.pre (the sets llama.cpp uses) -------------------

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CASED}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CASED}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕ"
    "ἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳ"
    "Ꙁ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃"
)


@attrs.frozen
class PreTokenizer:
    """How llama.cpp pre-splits byte-level BPE text for one ``tokenizer.ggml.pre`` value."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word already in the vocab is one token, merges or not
    add_bos: bool = False  # llama.cpp's add_bos default for this pre-tokenizer
    has_bos: bool = True


_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)


def _group(names: str, pre: PreTokenizer) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names.split(), pre)


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    **_group(
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de jina-v1-en jina-v2-code "
        "roberta-bpe a.x-4.0 mellum modern-bert mpt olmo jais trillion granite-docling "
        "exaone4",
        PreTokenizer((_GPT2,)),
    ),
    **_group(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        _LLAMA3_PRE,
    ),
    **_group("dbrx smaug-bpe", PreTokenizer((_LLAMA3,))),
    **_group("glm4 chatglm-bpe", PreTokenizer((_LLAMA3,), has_bos=False)),
    **_group(
        "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open",
        PreTokenizer((_QWEN2,)),
    ),
    "qwen35": PreTokenizer((_QWEN35,)),
    **_group(
        "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
        PreTokenizer((r"\p{N}", _GPT2)),
    ),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    **_group("gpt-4o llama4 kanana2 talkie minimax-m2", PreTokenizer((_GPT4O,))),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
    "deepseek-llm": PreTokenizer(
        (
            r"[\r\n]",
            rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+$",
            "[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        )
    ),
    "deepseek-coder": PreTokenizer(
        (
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        )
    ),
    **_group(
        "deepseek-v3 hunyuan-dense joyai-llm hy_v4",
        PreTokenizer(
            (
                r"\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            )
        ),
    ),
    **_group("poro-chat bloom gpt3-finnish", PreTokenizer((r" ?[^(\s|.,!?…。，、।۔،)]+",))),
}

# The Split regexes of Hugging Face tokenizer.json files, mapped to the llama.cpp pre name.
HF_PRE_REGEXES: dict[tuple[str, ...], str] = {
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"  # noqa: E501
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ): "llama-bpe",
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    ): "qwen2",
    (_GPT2 + r"|\s+",): "gpt-2",
    (r"\p{N}", _GPT2 + r"|\s+"): "smollm",
    (_GPT4O,): "gpt-4o",
}

# -- byte-level BPE's byte <-> printable character table (GPT-2) ----------------------------


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values onto printable unicode characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_CHAR_TO_BYTE = {c: b for b, c in _byte_to_char().items()}

# -- BERT (WPM) normalization, as llama.cpp's WPM preprocess does it --------------------------

_WHITESPACE = frozenset(
    map(
        chr,
        [
            *range(0x09, 0x0E),
            0x20,
            0x85,
            0xA0,
            0x1680,
            *range(0x2000, 0x200B),
            0x2028,
            0x2029,
            0x202F,
            0x205F,
            0x3000,
        ],
    )
)
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B920, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def wpm_words(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """Split text into words the way llama.cpp's WordPiece tokenizer does before matching."""
    if strip_accents:
        text = unicodedata.normalize("NFD", text)
    words: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch in _WHITESPACE:
            if word:
                words.append("".join(word))
                word = []
            continue
        cat = unicodedata.category(ch)
        if ch in ("\0", "\ufffd") or cat[0] == "C" or (strip_accents and cat[0] == "M"):
            continue
        if lowercase:
            low = ch.lower()
            ch = low if len(low) == 1 else low[0]  # llama.cpp maps one code point to one
        cp = ord(ch)
        if cat[0] == "P" or (cp < 0x7F and cat[0] == "S") or _is_cjk(cp):
            if word:
                words.append("".join(word))
                word = []
            words.append(ch)
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    return words


# -- the tokenizer ------------------------------------------------------------------------------

_C_SPACE = " \t\n\v\f\r"  # what C's isspace() strips around lstrip/rstrip special tokens
_SPECIAL_ID_KEYS = {
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

        pre_name = metadata.get("tokenizer.ggml.pre")
        self.pre: PreTokenizer | None = self._pick_pre(pre_name) if model == "gpt2" else None
        self._special_ids(metadata)
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
        self._find_eog()
        self._strip_attrs(
            str(metadata.get("general.name", "")),
            str(pre_name or ""),
            str(metadata.get("general.architecture", "")),
        )
        # Tokens cut out of raw text before the model runs: longest first, as llama.cpp does.
        cut = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
        self._cut_order = sorted(
            (i for i in range(n) if self._types[i] in cut),
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
        from tessera.gguf_file import read_gguf

        path = Path(path)
        if path.is_dir():
            return cls.from_hf_dir(path)
        return cls.from_gguf_metadata(read_gguf(path).metadata)

    @staticmethod
    def _pick_pre(name: str | None) -> PreTokenizer:
        if not name:
            log.warning("the vocabulary names no pre-tokenizer; using llama.cpp's 'default'")
            return PRE_TOKENIZERS["default"]
        if name not in PRE_TOKENIZERS:
            log.warning(
                "pre-tokenizer '%s' is not known to tessera; falling back to 'gpt-2', "
                "so tokenization may differ from the model's",
                name,
            )
            return PRE_TOKENIZERS["gpt-2"]
        return PRE_TOKENIZERS[name]

    def _special_ids(self, metadata: Mapping[str, Any]) -> None:
        n = len(self._tokens)
        ids: dict[str, int | None] = dict.fromkeys(_SPECIAL_ID_KEYS)
        ids.update(_DEFAULT_IDS[self.model])
        if self.model == "bert" and "tokenizer.ggml.cls_token_id" in metadata:
            ids["bos"] = metadata["tokenizer.ggml.cls_token_id"]
        for name, key in _SPECIAL_ID_KEYS.items():
            if key in metadata:
                ids[name] = int(metadata[key])
        if self.pre is not None and not self.pre.has_bos:
            ids["bos"] = None
        valid = {k: (v if v is not None and 0 <= v < n else None) for k, v in ids.items()}
        self.bos_id: int | None = valid["bos"]
        self.eos_id: int | None = valid["eos"]
        self.eot_id: int | None = valid["eot"]
        self.eom_id: int | None = valid["eom"]
        self.unk_id: int | None = valid["unk"]
        self.sep_id: int | None = valid["sep"]
        self.pad_id: int | None = valid["pad"]
        self.mask_id: int | None = valid["mask"]

    def _find_eog(self) -> None:
        eog = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        for text in EOG_TEXTS:
            tid = self._ids.get(text)
            if tid is not None:
                eog.add(tid)
                # llama.cpp overrides a "control-looking" token that was typed normal
                self._types[tid] = TokenType.CONTROL
        # gpt-oss style vocabularies end a turn with <|return|>/<|call|>; <|end|> is not EOG there
        if {"<|return|>", "<|call|>"} <= self._ids.keys() and "<|end|>" in self._ids:
            end = self._ids["<|end|>"]
            eog.discard(end)
            self._types[end] = TokenType.USER_DEFINED
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _strip_attrs(self, model_name: str, pre_name: str, arch: str) -> None:
        """Per-model whitespace stripping around special tokens (llama.cpp's LSTRIP/RSTRIP)."""
        self._lstrip: set[int] = set()
        self._rstrip: set[int] = set()
        name = model_name.lower()
        if any(s in pre_name for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
        ):
            if "<mask>" in self._ids:
                self._lstrip.add(self._ids["<mask>"])
        elif "phi-3" in name or "phi3" in name:
            cut = (TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN)
            self._rstrip = {i for i, t in enumerate(self._types) if t in cut}
            self._rstrip |= {self._ids[t] for t in ("</s>",) if t in self._ids}
            self._rstrip -= {
                self._ids[t] for t in ("<unk>", "<s>", "<|endoftext|>") if t in self._ids
            }
        elif "modern-bert" in name and "[MASK]" in self._ids:
            self._lstrip.add(self._ids["[MASK]"])

    def _build_model(self, metadata: Mapping[str, Any]) -> Any:
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if self.model == "gpt2":
            merges = _parse_merges(metadata.get("tokenizer.ggml.merges"), self._ids)
            assert self.pre is not None
            hf = HFTokenizer(models.BPE(self._ids, merges, ignore_merges=self.pre.ignore_merges))
            splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.pre.regexes]
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            return hf
        if self.model == "llama":
            scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(self._tokens)
            unk = self._tokens[self.unk_id] if self.unk_id is not None else None
            return HFTokenizer(
                models.BPE(
                    self._ids,
                    _spm_merges(self._tokens, scores, self._ids),
                    unk_token=unk,
                    byte_fallback=True,
                )
            )
        # bert: llama.cpp's vocab marks word starts with ▁; WordPiece marks the rest with ##
        vocab = {
            (t[1:] if t.startswith(SPACE_MARKER) else "##" + t): i for t, i in self._ids.items()
        }
        unk_id = self.unk_id if self.unk_id is not None else 0
        unk = next(k for k, v in vocab.items() if v == unk_id)
        return HFTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=1 << 30))

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
        if kind in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
            return text.encode()
        if kind == TokenType.BYTE and text.startswith("<0x") and len(text) == 6:
            return bytes([int(text[3:5], 16)])
        if self.model == "gpt2":
            return b"".join(
                bytes([_CHAR_TO_BYTE[c]]) if c in _CHAR_TO_BYTE else c.encode() for c in text
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


class StreamDecoder:
    """Incremental detokenization: feed ids one at a time, get back only complete UTF-8 text.

    A character split over several byte tokens is held back until its last byte arrives, so
    the concatenation of everything ``feed`` and ``flush`` return equals ``decode(ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_space = tokenizer._strips_prefix_space

    def feed(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        piece = self._tok.token_to_bytes(token_id)  # also rejects ids outside the vocabulary
        special = self._tok.is_special(token_id)
        if special and self._skip_special:
            piece = b""
        if self._strip_space and not special:
            self._strip_space = False
            if self._tok.token_type(token_id) == TokenType.NORMAL and piece.startswith(b" "):
                piece = piece[1:]
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """Return what is left (an incomplete character becomes U+FFFD) and reset."""
        return self._utf8.decode(b"", final=True)


def _parse_merges(merges: Sequence[str] | None, ids: Mapping[str, int]) -> list[tuple[str, str]]:
    if not merges:
        raise TokenizerError(
            "the byte-level BPE vocabulary has no tokenizer.ggml.merges; convert the model again"
        )
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)  # llama.cpp splits at the first space after the first char
        if cut < 0:
            continue
        left, right = merge[:cut], merge[cut + 1 :]
        # HF's BPE needs every part and product in the vocabulary; llama.cpp would fall back
        # to bytes for a product that is not, which no real vocabulary relies on.
        if left in ids and right in ids and left + right in ids:
            pairs.append((left, right))
    return pairs


def _spm_merges(
    tokens: Sequence[str], scores: Sequence[float], ids: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Merges that make HF's BPE behave like llama.cpp's SPM tokenizer.

    llama.cpp repeatedly merges the adjacent pair whose concatenation is the vocabulary token
    with the highest score. Every split of every token into two vocabulary tokens is such a
    pair; ranking them by the merged token's score gives BPE the same choice at each step.
    """
    ranked = []
    for tid, text in enumerate(tokens):
        if ids.get(text) != tid:
            continue
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in ids and right in ids:
                ranked.append((-scores[tid], tid, k, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


# -- Hugging Face folders -------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read '{path}' ({exc}); check the tokenizer folder") from exc


def _hf_pre_name(pre_tokenizer: Mapping[str, Any] | None) -> str:
    """The llama.cpp ``tokenizer.ggml.pre`` name of a tokenizer.json pre-tokenizer."""
    steps = [pre_tokenizer] if pre_tokenizer else []
    if steps and steps[0].get("type") == "Sequence":
        steps = list(steps[0].get("pretokenizers", []))
    regexes: list[str] = []
    byte_level = False
    for step in steps:
        kind = step.get("type")
        if kind == "Split" and "Regex" in step.get("pattern", {}):
            regexes.append(step["pattern"]["Regex"])
        elif kind == "Digits" and step.get("individual_digits"):
            regexes.append(r"\p{N}")
        elif kind == "ByteLevel":
            byte_level = True
            if step.get("use_regex", True):
                regexes.append(_GPT2 + r"|\s+")
        else:
            break
    else:
        name = HF_PRE_REGEXES.get(tuple(regexes)) if byte_level else None
        if name is not None:
            return name
    raise TokenizerError(
        f"tessera cannot map this tokenizer.json pre-tokenizer to a llama.cpp one "
        f"({json.dumps(pre_tokenizer)[:200]}); supported: byte-level BPE with the GPT-2, "
        f"Llama 3, Qwen2, SmolLM or GPT-4o split regex"
    )


def _token_content(value: Any) -> str | None:
    """A tokenizer_config.json token entry: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _looks_special(text: str) -> bool:
    # llama.cpp's converter also treats <|...|> and <｜...｜> tokens as control tokens
    return (text.startswith("<|") and text.endswith("|>")) or (
        text.startswith("<｜") and text.endswith("｜>")
    )


def hf_dir_metadata(path: Path) -> dict[str, Any]:
    """GGUF ``tokenizer.*`` metadata (llama.cpp's gpt2 keys) for a Hugging Face folder."""
    tj_path = path / "tokenizer.json"
    if not tj_path.is_file():
        raise TokenizerError(
            f"'{path}' has no tokenizer.json; pass a Hugging Face folder with a fast tokenizer "
            "or a .gguf file"
        )
    tj = _read_json(tj_path)
    model = tj.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise TokenizerError(
            f"'{tj_path}' holds a {model.get('type')} tokenizer; tessera reads only byte-level "
            "BPE tokenizer.json files — convert the model to GGUF with its vocabulary instead"
        )
    if (tj.get("normalizer") or {}).get("type") not in (None, "NFC"):
        raise TokenizerError(
            f"'{tj_path}' has a {tj['normalizer']['type']} normalizer that llama.cpp does not "
            "apply; convert the model to GGUF with its vocabulary instead"
        )
    pre = _hf_pre_name(tj.get("pre_tokenizer"))
    vocab: dict[str, int] = dict(model.get("vocab", {}))
    added = tj.get("added_tokens", [])
    n = 1 + max([*vocab.values(), *(a["id"] for a in added)])
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [int(TokenType.UNUSED)] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, int(TokenType.NORMAL)
    for a in added:
        special = a.get("special") or _looks_special(a["content"])
        tokens[a["id"]] = a["content"]
        types[a["id"]] = int(TokenType.CONTROL if special else TokenType.USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    config_path = path / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    ids = {text: i for i, text in enumerate(tokens)}
    for name in ("bos", "eos", "unk", "pad"):
        tid = ids.get(_token_content(config.get(f"{name}_token")) or "")
        if tid is not None:
            meta[_SPECIAL_ID_KEYS[name]] = tid
    add_bos = config.get("add_bos_token")
    if add_bos is None:
        # newer folders say it only through the post-processor template; HF adds no BOS
        # without one, whatever llama.cpp's default for the pre-tokenizer is
        single = (tj.get("post_processor") or {}).get("single") or [{}]
        first = single[0].get("SpecialToken", {}).get("id")
        bos = meta.get(_SPECIAL_ID_KEYS["bos"])
        add_bos = bos is not None and first == tokens[bos]
    meta["tokenizer.ggml.add_bos_token"] = bool(add_bos)
    if config.get("add_eos_token") is not None:
        meta["tokenizer.ggml.add_eos_token"] = bool(config["add_eos_token"])
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text(encoding="utf-8")
    if template:
        meta["tokenizer.chat_template"] = template
    return meta

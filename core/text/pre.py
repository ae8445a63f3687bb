"""How llama.cpp pre-splits byte-level BPE text: its regex sets by ``tokenizer.ggml.pre``.

Also maps the Split regexes of Hugging Face tokenizer.json files onto those names, so a
Hugging Face folder is tokenized with the same rules as its GGUF conversion.
"""

from __future__ import annotations

import logging

import attrs

log = logging.getLogger(__name__)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp spells out the letter case of contractions; tokenizer.json files use (?i:...).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_HF_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3_REST = (
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REST = r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = _CONTRACTIONS + _LLAMA3_REST
_QWEN2 = _CONTRACTIONS + _QWEN2_REST
_QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CASED = _HF_CONTRACTIONS + "?"
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

# The split Hugging Face's ByteLevel pre-tokenizer applies when use_regex is on.
HF_BYTE_LEVEL_REGEX = _GPT2 + r"|\s+"


@attrs.frozen
class PreTokenizer:
    """How llama.cpp pre-splits byte-level BPE text for one ``tokenizer.ggml.pre`` value."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word already in the vocab is one token, merges or not
    add_bos: bool = False  # llama.cpp's add_bos default for this pre-tokenizer
    has_bos: bool = True


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
        PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True),
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
    (_HF_CONTRACTIONS + _LLAMA3_REST,): "llama-bpe",
    (_HF_CONTRACTIONS + _QWEN2_REST,): "qwen2",
    (HF_BYTE_LEVEL_REGEX,): "gpt-2",
    (r"\p{N}", HF_BYTE_LEVEL_REGEX): "smollm",
    (_GPT4O,): "gpt-4o",
}


def pick_pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre`` = ``name``."""
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

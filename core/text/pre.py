"""Every ``tokenizer.ggml.pre`` llama.cpp knows: its regexes and the tokenizer flags it sets.

Also maps the Split regexes of Hugging Face tokenizer.json files onto those names, so a
Hugging Face folder is tokenized with the same rules as its GGUF conversion.
"""

from __future__ import annotations

import logging

import attrs

from tessera.text import pre_regexes as rx
from tessera.text.vocab import TokenizerError

log = logging.getLogger(__name__)


@attrs.frozen
class PreTokenizer:
    """How llama.cpp pre-splits BPE text for one ``tokenizer.ggml.pre`` value."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word already in the vocab is one token, merges or not
    add_bos: bool = False  # llama.cpp's add_bos default for this pre-tokenizer
    has_bos: bool = True  # False: llama.cpp drops the default BOS id
    add_sep: bool = False  # llama.cpp's add_sep default (RoBERTa-style encoders)
    byte_encode: bool = True  # GPT-2's byte-to-character map before BPE
    escape_whitespaces: bool = False  # spaces become "▁" first (SentencePiece-style BPE)
    newline_tokens: bool = False  # a run of newlines in the vocab is one token (Gemma 4)
    lowercase: bool | None = None  # the default of tokenizer.ggml.normalizer.lowercase


def _group(names: str, pre: PreTokenizer) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names.split(), pre)


_SPM_STYLE = PreTokenizer(rx.NEWLINES, byte_encode=False, escape_whitespaces=True)

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(rx.DEFAULT),
    "minicpm5": PreTokenizer(rx.MINICPM5, ignore_merges=True),
    **_group(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        PreTokenizer(rx.LLAMA3, ignore_merges=True, add_bos=True),
    ),
    "deepseek-llm": PreTokenizer(rx.DEEPSEEK_LLM),
    "deepseek-coder": PreTokenizer(rx.DEEPSEEK_CODER),
    **_group("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", PreTokenizer(rx.DEEPSEEK3)),
    "spark2_5": PreTokenizer(rx.SPARK2_5),
    "youtu": PreTokenizer(rx.YOUTU, ignore_merges=True),
    "falcon": PreTokenizer(rx.FALCON),
    **_group(
        "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
        "mpt olmo jais trillion granite-docling exaone4",
        PreTokenizer(rx.GPT2),
    ),
    "jais-2": PreTokenizer(rx.JAIS2),
    **_group("gemma4 granite-embed-multi-311m", attrs.evolve(_SPM_STYLE, newline_tokens=True)),
    "sarvam-moe": _SPM_STYLE,
    **_group("jina-v1-en jina-v2-code roberta-bpe", PreTokenizer(rx.GPT2, add_sep=True)),
    "whitespace": PreTokenizer(rx.WHITESPACE, byte_encode=False, lowercase=False),
    **_group(
        "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
        PreTokenizer(rx.STARCODER),
    ),
    **_group(
        "qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 megrez hunyuan grok-2 solar-open",
        PreTokenizer(rx.QWEN2),
    ),
    "qwen35": PreTokenizer(rx.QWEN35),
    **_group("dbrx smaug-bpe", PreTokenizer(rx.LLAMA3)),
    **_group("poro-chat bloom gpt3-finnish", PreTokenizer(rx.PORO)),
    "chatglm-bpe": PreTokenizer(rx.LLAMA3, has_bos=False),
    **_group("glm4 glm5", PreTokenizer(rx.LLAMA3, has_bos=False, ignore_merges=True)),
    "viking": PreTokenizer(rx.VIKING),
    "tekken": PreTokenizer(rx.TEKKEN, ignore_merges=True, add_bos=True),
    "exaone-moe": PreTokenizer(rx.EXAONE_MOE),
    "chameleon": PreTokenizer(rx.CHAMELEON, add_bos=True),
    **_group("gpt-4o llama4 kanana2 talkie minimax-m2", PreTokenizer(rx.GPT4O)),
    "granite-embed-multi-97m": PreTokenizer(rx.GRANITE_EMB_MULTI, ignore_merges=True),
    **_group("tiny_aya cohere2moe", PreTokenizer(rx.TINY_AYA)),
    "superbpe": PreTokenizer(rx.SUPERBPE),
    **_group("bailingmoe bailingmoe2 llada-moe", PreTokenizer(rx.BAILINGMOE)),
    "seed-coder": PreTokenizer(rx.SEED_CODER),
    "kimi-k2": PreTokenizer(rx.KIMI),
    "ufakzeka": PreTokenizer(rx.UFAKZEKA),
    "afmoe": PreTokenizer(rx.AFMOE),
    "laguna": PreTokenizer(rx.LAGUNA),
}

# The Split regexes of Hugging Face tokenizer.json files, mapped to the llama.cpp pre name.
_HF_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_HF_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# The split Hugging Face's ByteLevel pre-tokenizer applies when use_regex is on.
HF_BYTE_LEVEL_REGEX = rx.GPT2_REGEX + r"|\s+"
_HF_CASED = _HF_CONTRACTIONS + "?"
_HF_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_HF_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_HF_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_HF_UPPER}*{_HF_LOWER}+{_HF_CASED}"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_HF_UPPER}+{_HF_LOWER}*{_HF_CASED}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
HF_PRE_REGEXES: dict[tuple[str, ...], str] = {
    (_HF_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _HF_TAIL,): "llama-bpe",
    (_HF_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _HF_TAIL,): "qwen2",
    (HF_BYTE_LEVEL_REGEX,): "gpt-2",
    (r"\p{N}", HF_BYTE_LEVEL_REGEX): "smollm",
    (_HF_GPT4O,): "gpt-4o",
}


def pick_pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre`` = ``name``."""
    if not name:
        log.warning("the vocabulary names no pre-tokenizer; using llama.cpp's 'default'")
        return PRE_TOKENIZERS["default"]
    if name not in PRE_TOKENIZERS:
        raise TokenizerError(
            f"pre-tokenizer '{name}' (tokenizer.ggml.pre) is not one llama.cpp knows, so "
            "tessera cannot tell how to split the text; convert the model with a llama.cpp "
            "that knows it and a tessera release that lists it"
        )
    return PRE_TOKENIZERS[name]

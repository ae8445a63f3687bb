"""The regexes llama.cpp pre-splits byte-level BPE text with, one tuple per pre-tokenizer kind.

They are written as llama.cpp writes them (ECMAScript, with ``\\p{..}`` categories and the
contractions spelled out case by case, since ECMAScript has no ``(?i:..)``);
:mod:`tessera.text.pre_split` runs them. Characters outside ASCII are written as escapes so
that no editor can normalize them (several ranges rely on un-normalized code points).
"""

from __future__ import annotations

from tessera.text.pre_split import AFMOE_DIGITS, KIMI_K2, TINY_AYA_DIGITS

CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_WORD = r"[^\r\n\p{L}\p{N}]?\p{L}+"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = rf"{CONTRACTIONS}|{_WORD}|\p{{N}}{{1,3}}{_TAIL}"
QWEN2_REGEX = rf"{CONTRACTIONS}|{_WORD}|\p{{N}}{_TAIL}"
# Letters and digits as GPT-4o's tokenizer.json splits them: cased words, where llama.cpp
# reads "upper" as "a letter other than a-z" and "lower" as "a letter other than A-Z".
_UPPER_OF = r"((?=[{0}])([^a-z]))"
_LOWER_OF = r"((?=[{0}])([^A-Z]))"
_CASED_TAIL = r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _cased_words(letters: str, suffix: str) -> str:
    upper, lower = _UPPER_OF.format(letters), _LOWER_OF.format(letters)
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{upper}*{lower}+{suffix}|{lead}{upper}+{lower}*{suffix}"


_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3_WORDS = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
)
_DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1"
    "\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd"
    "\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4"
    "\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec"
    "\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b"
    "\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
_NEWLINE_RUNS = r"[^\n]+|[\n]+"

DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]")
GPT2 = (GPT2_REGEX,)
LLAMA3 = (LLAMA3_REGEX,)
QWEN2 = (QWEN2_REGEX,)
STARCODER = (r"\p{N}", GPT2_REGEX)
FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, "[0-9][0-9][0-9]")
JAIS2 = (
    rf"{CONTRACTIONS}|{_WORD}|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+"
    + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
    + r"|\s{1,2}(?!\S)|\s{1}",
)
DEEPSEEK_LLM = (
    "[\r\n]",
    rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}+",
)
DEEPSEEK_CODER = (
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}",
)
DEEPSEEK3 = (
    r"\p{N}{1,3}",
    _CJK_KANA,
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
SPARK2_5 = (
    r"\p{N}{1,3}",
    _CJK_KANA,
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
)
YOUTU = (
    "[\uac00-\ud7a3\u3131-\u318e]+"
    "|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+"
    "|[\u3105-\u312f]+|" + _CJK_KANA,
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    + CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    + CONTRACTIONS
    + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
QWEN35 = (
    rf"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
PORO = (_PORO,)
VIKING = (_PORO, r"\p{N}")
TEKKEN = (
    _cased_words(r"\p{L}", "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
CHAMELEON = (
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2_REGEX,
)
GPT4O = (_cased_words(r"\p{L}", CONTRACTIONS + "?") + "|" + _CASED_TAIL,)
GRANITE_EMB_MULTI = (_cased_words(r"\p{L}\p{M}", CONTRACTIONS + "?") + "|" + _CASED_TAIL,)
TINY_AYA = (
    TINY_AYA_DIGITS,
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    + CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    + CONTRACTIONS
    + "?|"
    + _CASED_TAIL,
)
KIMI = (KIMI_K2,)
SUPERBPE = (r"\p{N}+", r"(?=(\d{3})+(?!\d))")
BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
)
SEED_CODER = (
    rf"{CONTRACTIONS}|{_WORD}|\p{{N}}{{1}}| ?[^\s\p{{L}}\p{{N}}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
)
UFAKZEKA = (rf"{_WORD}|\p{{N}}{_TAIL}",)
AFMOE = (
    AFMOE_DIGITS,
    "[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
    "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f"
    "\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
LAGUNA = (_NEWLINE_RUNS, QWEN2_REGEX)
EXAONE_MOE = (
    rf"{CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?(?:\p{{L}}\p{{M}}*(?: \p{{L}}\p{{M}}*)*)+|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
)
NEWLINES = (_NEWLINE_RUNS,)  # Gemma 4, Sarvam: SentencePiece-style BPE over whole lines
MINICPM5 = (
    r"\p{N}{1,3}",
    rf"{CONTRACTIONS}|{_WORD}|\p{{N}}+{_TAIL}",
)
WHITESPACE = (r"\S+",)

"""Builds the small vocabularies of this folder that llama.cpp does not ship (see README.md).

``mini-*`` files keep, of a llama.cpp vocabulary too large to commit, the tokens that can take
part in tokenizing the test strings (every token that is a substring of one, the byte tokens,
the special tokens) and the merges that make them, renumbered; ``record_llama_cpp.py`` checks
that llama.cpp tokenizes the strings with them exactly as with the full file. ``synthetic-*``
files are vocabularies of the kinds llama.cpp ships no test file for (RWKV, PLaMo-2, the
``whitespace`` and ``hybriddna`` BPE models), made from the mini vocabularies.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tessera.files.gguf import read_gguf
from tessera.files.gguf_writer import TypedValue, write_gguf
from tessera.plugin_manager import Runtime
from tessera.text.bpe import BYTE_TO_CHAR
from tessera.text.tokenizer import Tokenizer

HERE = Path(__file__).resolve().parent
SEPARATOR = "\n__ggml_vocab_test__\n"

#: Strings beyond llama.cpp's own that reach the corners of the pre-tokenizers and models.
STRESS = [
    "Hello WORLD İstanbul Ärger ÉCOLE École HelloÉcole camelCase XMLHttpRequest ǅungla",
    "don't DON'T I'LL we'Ve she'D 'S 'sx y'all O'Neil",
    "1 12 123 1234 12345 123456 1234567 12345678901 x123456 ١٢٣٤٥ ²³ ½ Ⅻ 3.14159 1,000,000",
    "안녕하세요 세계 ㄱㄴㄷ ㄅㄆㄇ こんにちは、世界！カタカナ ｶﾀｶﾅ "
    "我想在apple工作1314151天～ 你好，世界。",
    "\U00020000\U00020001 \U0002a700 \U0002ebf0 \U00031350 \u2f00\u2fdf 豈 \U0002f800",
    "สวัสดีครับ ສະບາຍດີ មិនអីទេ မင်္ဂလာပါ ꩠꩡ",
    "e\u0301 a\u0308 Z\u0351\u0352 \u0301x हिन्दी বাংলা తెలుగు",
    "مرحبا بالعالم، كيف حالك؟ ۔ שלום",
    "a  b   c\t\td\n\n e \r\n f\u3000g\u00a0h\u2028i\u0085j\u1680k",
    " " * 600 + "x",
    "\n" + " " * 20 + "y\t\t\t\t\t\t\t\t\tz",
    "<sentinel:12> IMGIMGABCZ IMGIMGABCDEZ IMGIMGJZ  x    y",
    "İstanbul'da Ankara'ya Türkiye'nin",
    "\n",
    "\n\n\n\n\n",
    "a\n\nb\n",
    "\x01\x1c\x1f\x7f abc\x02def",
    "\u0378 \ue000\ue001 \U000f0000 \u1c89 \U0001fae9 \u0cf3",
    "！？（）【】“引号” ——— … ‘single’ 、。",
    "trailing spaces   ",
    "   ",
    "👨‍👩‍👧‍👦 🏳️‍🌈 1️⃣ 🇩🇪",
    "def f(x):\n\treturn x**2  # comment\n\n",
    "https://example.com/a/b?c=d&e=f /usr/bin/env hello world/ foo//bar",
    "DNA <dna>acgtACGTnn</dna> tail <dna>ACGTAC</dna><dna>ACG",
    "\ufeffstart with a byte order mark",
    "Ωmega \u212a kelvin \u1fd3 \u1ffc \u2126",
    "ＡＢＣ ａｂｃ １２３ ﬁ ㍿ ⅷ",
    "$100 10% a+b=c <x> ^_^ ~ | `code` {x} [y]",
    "Tab\tafter\tword\r\rCR",
]


def read_inp(path: Path) -> list[str]:
    """The strings of a llama.cpp .inp file (the last may lack its separator)."""
    texts = path.read_bytes().decode("utf-8").split(SEPARATOR)  # no newline translation
    return texts[:-1] if texts[-1] == "" else texts


def write_inp(path: Path, texts: Sequence[str]) -> None:
    path.write_text("".join(t + SEPARATOR for t in texts), encoding="utf-8", newline="")


def standard_texts(models: Path) -> list[str]:
    """llama.cpp's test strings (those of qwen35 are a superset of the others) and ours."""
    return read_inp(models / "ggml-vocab-qwen35.gguf.inp") + STRESS


def _typed(metadata: dict[str, Any]) -> dict[str, Any]:
    from gguf import GGUFValueType as V

    out = dict(metadata)
    charsmap = out.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None:
        out["tokenizer.ggml.precompiled_charsmap"] = TypedValue(list(charsmap), V.ARRAY, V.UINT8)
    return out


def subset(metadata: dict[str, Any], keep: Callable[[int, str, int], bool]) -> dict[str, Any]:
    """The vocabulary restricted to the tokens ``keep(id, text, type)`` accepts, renumbered;
    merges whose product survives stay, in order; special-id keys follow their tokens."""
    tokens = metadata["tokenizer.ggml.tokens"]
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    kept = [i for i, t in enumerate(tokens) if keep(i, t, types[i])]
    new_id = {old: new for new, old in enumerate(kept)}
    out = dict(metadata)
    out["tokenizer.ggml.tokens"] = [tokens[i] for i in kept]
    out["tokenizer.ggml.token_type"] = [types[i] for i in kept]
    if "tokenizer.ggml.scores" in metadata:
        out["tokenizer.ggml.scores"] = [metadata["tokenizer.ggml.scores"][i] for i in kept]
    if "tokenizer.ggml.merges" in metadata:
        texts = set(out["tokenizer.ggml.tokens"])
        out["tokenizer.ggml.merges"] = [
            m for m in metadata["tokenizer.ggml.merges"] if m.replace(" ", "", 1) in texts
        ]
    for key in [k for k in out if k.endswith("_token_id")]:
        if out[key] in new_id:
            out[key] = new_id[out[key]]
        else:
            del out[key]
    out.pop("tokenizer.chat_template", None)
    return out


def _byte_level(text: str) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in text.encode())


def mini(models: Path, name: str, texts: Sequence[str]) -> Path:
    """``mini-NAME.gguf``: llama.cpp's ggml-vocab-NAME.gguf cut down to ``texts``."""
    metadata = dict(read_gguf(models / f"ggml-vocab-{name}.gguf").metadata)
    model = metadata["tokenizer.ggml.model"]
    joined = "\x00".join(texts)
    if model == "gpt2":
        haystack = _byte_level(joined)
    elif model == "t5":  # what Viterbi sees, with and without each space flag
        normalized = []
        for prefix, merge in itertools.product((False, True), repeat=2):
            flags = {"add_space_prefix": prefix, "remove_extra_whitespaces": merge}
            tok = Tokenizer.from_gguf_metadata(
                metadata | {f"tokenizer.ggml.{k}": v for k, v in flags.items()}, Runtime()
            )
            normalized += [tok._model.normalize(t) for t in texts]
        haystack = "\x00".join(normalized)
    else:  # SentencePiece-style: spaces escaped, and raw for the whitespace model
        haystack = joined.replace(" ", "\u2581") + "\x00" + joined
    scores = metadata.get("tokenizer.ggml.scores") or []
    lowest = min(
        (s for s, t in zip(scores, metadata["tokenizer.ggml.token_type"], strict=False) if t == 1),
        default=0,
    )

    def keep(i: int, text: str, kind: int) -> bool:
        # the lowest-scoring token stays: it sets a unigram model's unknown-token score
        return kind != 1 or text in haystack or (model == "t5" and scores[i] == lowest)

    path = HERE / f"mini-{name}.gguf"
    write_gguf(path, _typed(subset(metadata, keep)), [])
    return path


def _rwkv_escape(data: bytes) -> str:
    named = {9: "\\t", 10: "\\n", 13: "\\r", 92: "\\\\"}
    return "".join(named.get(b) or (chr(b) if 32 <= b < 127 else f"\\x{b:02x}") for b in data)


def synthetic(models: Path, texts: Sequence[str]) -> list[Path]:
    """The synthetic vocabularies (RWKV, PLaMo-2, whitespace, hybriddna)."""
    base = dict(read_gguf(HERE / "mini-qwen2.gguf").metadata)
    arch = {k: v for k, v in base.items() if not k.startswith("tokenizer.")}
    data = "\x00".join(texts).encode()
    words = {w for t in texts for w in t.encode().replace(b"\n", b" ").split(b" ") if w}
    pieces = sorted({p for w in words for n in (2, 3, 5) for p in (w[:n], b" " + w[:n])} | words)
    rwkv = [b"<|endoftext|>"] + [bytes([b]) for b in range(256)]
    rwkv += [p for p in pieces if len(p) > 1 and p in data]
    paths = [HERE / "synthetic-rwkv.gguf"]
    write_gguf(
        paths[-1],
        arch
        | {
            "tokenizer.ggml.model": "rwkv",
            "tokenizer.ggml.tokens": [_rwkv_escape(t) for t in rwkv],
            "tokenizer.ggml.token_type": [3] + [1] * (len(rwkv) - 1),
        },
        [],
    )
    unigram = dict(read_gguf(HERE / "mini-nomic-bert-moe.gguf").metadata)
    specials = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>"]
    plamo = [(t, 0.0, 3) for t in specials] + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    columns = (unigram[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    normal = [(t.replace("\u2581", " "), s, 1) for t, s, k in zip(*columns, strict=True) if k == 1]
    # a score at llama.cpp's "unknown" sentinel, one that is not a number, one halfway
    # between two integers after scaling (C rounds it away from zero)
    normal += [("lowest", -1000.0, 1), ("nan", math.nan, 1), ("!?", -0.03125, 1)]
    seen = {t for t, _, _ in plamo}
    for piece in normal:
        if piece[0] not in seen:
            seen.add(piece[0])
            plamo.append(piece)
    paths.append(HERE / "synthetic-plamo2.gguf")
    write_gguf(
        paths[-1],
        arch
        | {
            "tokenizer.ggml.model": "plamo2",
            "tokenizer.ggml.tokens": [t for t, _, _ in plamo],
            "tokenizer.ggml.scores": [s for _, s, _ in plamo],
            "tokenizer.ggml.token_type": [k for _, _, k in plamo],
        },
        [],
    )
    gemma = dict(read_gguf(HERE / "mini-gemma-4.gguf").metadata)
    paths.append(HERE / "synthetic-whitespace.gguf")
    write_gguf(
        paths[-1],
        _typed(
            arch
            | {k: v for k, v in gemma.items() if k.startswith("tokenizer.")}
            | {
                "tokenizer.ggml.model": "whitespace",
                "tokenizer.ggml.pre": "whitespace",
                "tokenizer.ggml.normalizer.lowercase": True,
            }
        ),
        [],
    )
    kmers = ["".join(k) + "\ue000" for k in itertools.product("ACGT", repeat=6)]
    extra = ["<dna>", "</dna>", "<oov>", *kmers]
    dna = dict(base)
    dna["tokenizer.ggml.model"] = "hybriddna"
    dna["tokenizer.ggml.tokens"] = base["tokenizer.ggml.tokens"] + extra
    dna["tokenizer.ggml.token_type"] = base["tokenizer.ggml.token_type"] + [1] * len(extra)
    paths.append(HERE / "synthetic-hybriddna.gguf")
    write_gguf(paths[-1], dna, [])
    return paths

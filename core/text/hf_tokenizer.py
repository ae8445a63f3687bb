"""Reading a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json) as the
GGUF ``tokenizer.*`` metadata llama.cpp's converter would write for it (byte-level BPE and
BERT's WordPiece)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tessera.text.pre import HF_BYTE_LEVEL_REGEX, HF_PRE_REGEXES
from tessera.text.vocab import SPECIAL_ID_KEYS, TokenizerError, TokenType


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
                regexes.append(HF_BYTE_LEVEL_REGEX)
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


def _empty_table(tj: Mapping[str, Any]) -> tuple[dict[str, int], list, list[str], list[int]]:
    """The model's vocabulary, its added tokens, and a token table that covers both ids
    with every row a padding token (``[PADi]``, unused) until filled in."""
    vocab: dict[str, int] = dict(tj["model"].get("vocab", {}))
    added = tj.get("added_tokens", [])
    n = 1 + max([*vocab.values(), *(a["id"] for a in added)])
    return vocab, added, [f"[PAD{i}]" for i in range(n)], [int(TokenType.UNUSED)] * n


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
    if model.get("type") == "WordPiece":
        return wordpiece_metadata(path, tj)
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
    vocab, added, tokens, types = _empty_table(tj)
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
            meta[SPECIAL_ID_KEYS[name]] = tid
    add_bos = config.get("add_bos_token")
    if add_bos is None:
        # newer folders say it only through the post-processor template; HF adds no BOS
        # without one, whatever llama.cpp's default for the pre-tokenizer is
        single = (tj.get("post_processor") or {}).get("single") or [{}]
        first = single[0].get("SpecialToken", {}).get("id")
        bos = meta.get(SPECIAL_ID_KEYS["bos"])
        add_bos = bos is not None and first == tokens[bos]
    meta["tokenizer.ggml.add_bos_token"] = bool(add_bos)
    if config.get("add_eos_token") is not None:
        meta["tokenizer.ggml.add_eos_token"] = bool(config["add_eos_token"])
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    template_path = path / "chat_template.jinja"
    if template is None and template_path.is_file():
        template = template_path.read_text(encoding="utf-8")
    if template:
        meta["tokenizer.chat_template"] = template
    return meta


def wordpiece_metadata(path: Path, tj: Mapping[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``bert`` vocabulary for a WordPiece tokenizer.json: word starts marked
    with ``▁`` instead of continuations with ``##``, special tokens as control tokens, the
    [CLS] ... [SEP] frame as BOS/EOS, and BERT's lowercasing from the normalizer."""
    model = tj["model"]
    vocab, added, tokens, types = _empty_table(tj)
    prefix = model.get("continuing_subword_prefix", "##")
    for text, i in vocab.items():
        if text.startswith("[") and text.endswith("]"):
            tokens[i] = text
        elif text.startswith(prefix):
            tokens[i] = text[len(prefix) :]
        else:
            tokens[i] = "\u2581" + text
        types[i] = int(TokenType.NORMAL)
    for a in added:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = int(TokenType.CONTROL if a.get("special") else TokenType.USER_DEFINED)
    config_path = path / "tokenizer_config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
    ids = {text: i for i, text in enumerate(tokens)}

    def token_id(name: str, default: str) -> int | None:
        return ids.get(_token_content(config.get(f"{name}_token")) or default)

    normalizer = tj.get("normalizer") or {}
    lowercase = bool(normalizer.get("lowercase", config.get("do_lower_case", True)))
    strip_accents = normalizer.get("strip_accents")
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        # gguf's SpecialVocab: [CLS] is BOS and [SEP] EOS when the config names no others
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": True,
        "tokenizer.ggml.add_sep_token": False,
        "tokenizer.ggml.normalizer.lowercase": lowercase,
        "tokenizer.ggml.normalizer.strip_accents": bool(
            lowercase if strip_accents is None else strip_accents
        ),
    }
    special = {
        "bos": token_id("cls", "[CLS]"),
        "eos": token_id("sep", "[SEP]"),
        "unk": token_id("unk", "[UNK]"),
        "sep": token_id("sep", "[SEP]"),
        "pad": token_id("pad", "[PAD]"),
        "mask": token_id("mask", "[MASK]"),
    }
    for name, tid in special.items():
        if tid is not None:
            meta[SPECIAL_ID_KEYS[name]] = tid
    config_json = path / "config.json"
    if config_json.is_file():
        meta["tokenizer.ggml.token_type_count"] = int(
            _read_json(config_json).get("type_vocab_size", 2)
        )
    return meta

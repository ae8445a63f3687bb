"""Hugging Face tokenizer folders, read as the GGUF metadata llama.cpp's converter writes;
HF ``tokenizers`` itself is the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.text.tokenizer import Tokenizer, TokenizerError

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
SAMPLES = [
    "Hello world",
    "  indented\n\tcode(x) = 12345;",
    "naïve café — 日本語 🦙",
    "it's they'll WE'RE",
    "<|endoftext|> after",
    "",
    "\n\n\n",
]


def _train_hf_folder(folder: Path, split_regex: str | None) -> object:
    """Train a small byte-level BPE (the oracle) and save it as an HF tokenizer folder."""
    from pydoc_data.topics import topics

    from tokenizers import Regex, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer(models.BPE())
    if split_regex is None:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator([topics[k] for k in sorted(topics)[:60]], trainer)
    hf.save(str(folder / "tokenizer.json"))
    config = {"bos_token": None, "eos_token": "<|endoftext|>", "chat_template": "{{ x }}"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return hf


@pytest.mark.parametrize(
    ("split_regex", "pre"),
    [
        (None, "gpt-2"),
        (LLAMA3_SPLIT, "llama-bpe"),
        (QWEN2_SPLIT, "qwen2"),
    ],
)
def test_hf_folder_round_trips_through_gguf_metadata(
    tmp_path: Path, split_regex: str | None, pre: str
) -> None:
    hf = _train_hf_folder(tmp_path, split_regex)
    tok = Tokenizer.from_hf_dir(tmp_path)
    meta = tok.gguf_metadata()
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == pre
    assert len(meta["tokenizer.ggml.token_type"]) == len(meta["tokenizer.ggml.tokens"])
    assert tok.eos_id == tok.token_id("<|endoftext|>") and tok.chat_template == "{{ x }}"
    back = Tokenizer.from_gguf_metadata(meta)
    for text in SAMPLES:
        # HF's own BPE is the oracle; it always cuts out special tokens, hence parse_special
        ids = tok.encode(text, add_special=False, parse_special=True)
        assert ids == hf.encode(text).ids
        assert back.encode(text, add_special=False, parse_special=True) == ids
        assert back.decode(ids) == text
        assert back.decode(back.encode(text, add_special=False)) == text


def test_hf_folder_with_an_unmappable_pre_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    _train_hf_folder(tmp_path, r"\w+")
    with pytest.raises(TokenizerError, match="cannot map this tokenizer.json pre-tokenizer"):
        Tokenizer.from_hf_dir(tmp_path)


def test_hf_folder_without_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)

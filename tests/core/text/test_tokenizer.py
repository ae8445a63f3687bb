"""The tokenizer against llama.cpp's own test vectors (tests/data/vocab) and HF ``tokenizers``."""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import pytest

from tessera.errors import TesseraError
from tessera.files.gguf import read_gguf
from tessera.text.stream import StreamDecoder
from tessera.text.tokenizer import Tokenizer, TokenizerError

VOCAB_DIR = Path(__file__).resolve().parents[2] / "data" / "vocab"
VOCABS = ("llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2", "bert-bge")
LOSSLESS = ("llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2")  # BERT lowercases and splits
SEPARATOR = "\n__ggml_vocab_test__\n"


def _vectors(name: str) -> list[tuple[str, list[int]]]:
    """The (text, ids) pairs of one vocab: every .inp string is followed by the separator."""
    texts = (VOCAB_DIR / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    assert texts[-1] == ""
    lines = (VOCAB_DIR / f"ggml-vocab-{name}.gguf.out").read_text().split("\n")
    assert lines[-1] == ""
    assert len(texts) == len(lines)
    pairs = zip(texts[:-1], lines[:-1], strict=True)
    return [(text, [int(x) for x in line.split()]) for text, line in pairs]


def _cases(names: tuple[str, ...]) -> list:
    return [
        pytest.param(name, text, ids, id=f"{name}-{i:02d}")
        for name in names
        for i, (text, ids) in enumerate(_vectors(name))
    ]


@functools.cache
def _metadata(name: str) -> dict:
    return dict(read_gguf(VOCAB_DIR / f"ggml-vocab-{name}.gguf").metadata)


@functools.cache
def vocab(name: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(_metadata(name))


# -- llama.cpp's vectors ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text", "ids"), _cases(VOCABS))
def test_encode_matches_llama_cpp(name: str, text: str, ids: list[int]) -> None:
    assert vocab(name).encode(text, add_special=False) == ids


@pytest.mark.parametrize(("name", "text", "ids"), _cases(LOSSLESS))
def test_decode_round_trips(name: str, text: str, ids: list[int]) -> None:
    tok = vocab(name)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text), skip_special=True) == text


@pytest.mark.parametrize(("name", "text", "ids"), _cases(("bert-bge",)))
def test_bert_decode_gives_the_normalized_words(name: str, text: str, ids: list[int]) -> None:
    """WordPiece drops case, accents and spacing, so decoding gives the normalized words back.

    The oracle is HF's BertNormalizer; the comparison ignores whitespace (which WordPiece
    does not keep) and words that became [UNK].
    """
    from tokenizers.normalizers import BertNormalizer

    tok = vocab(name)
    decoded = tok.decode(ids)
    if tok.unk_id in ids:
        assert "[UNK]" in decoded
        return
    normalized = BertNormalizer(lowercase=True, strip_accents=True).normalize_str(text)
    assert "".join(decoded.split()) == "".join(normalized.split())


# -- special tokens, BOS/EOS, end of generation -------------------------------------------------


def test_control_tokens_are_parsed_only_when_asked() -> None:
    tok = vocab("qwen2")
    text = "<|im_start|>user\nHi<|im_end|>"
    parsed = tok.encode(text, add_special=False, parse_special=True)
    assert parsed[0] == tok.token_id("<|im_start|>") and parsed[-1] == tok.token_id("<|im_end|>")
    assert tok.decode(parsed) == text
    plain = tok.encode(text, add_special=False)
    assert tok.token_id("<|im_start|>") not in plain
    assert tok.decode(plain) == text


def test_spm_prefixes_a_space_after_a_special_token() -> None:
    tok = vocab("llama-spm")
    assert tok.encode("<s>Hello", add_special=False, parse_special=True) == [1, 15043]
    assert tok.encode("<s>Hello", add_special=False) == tok.encode(
        "<s>Hello", add_special=False, parse_special=False
    )
    assert 1 not in tok.encode("<s>Hello", add_special=False)


def test_user_defined_tokens_are_always_split_out_and_phi3_strips_after_them() -> None:
    tok = vocab("phi-3")
    end = tok.token_id("</s>")
    ids = tok.encode("Hi</s>   there", add_special=False)
    assert end in ids
    # phi-3's special tokens eat the whitespace to their right (llama.cpp's RSTRIP)
    assert ids == tok.encode("Hi</s>there", add_special=False)


@pytest.mark.parametrize(
    ("name", "first", "last"),
    [
        ("llama-spm", 1, None),
        ("phi-3", 1, None),
        ("llama-bpe", 128000, None),
        ("qwen2", None, None),
        ("gpt-2", None, None),
        ("bert-bge", 101, 102),
    ],
)
def test_bos_and_eos_follow_the_model(name: str, first: int | None, last: int | None) -> None:
    tok = vocab(name)
    bare = tok.encode("Hello world", add_special=False)
    full = tok.encode("Hello world")
    assert full == [first] * (first is not None) + bare + [last] * (last is not None)


def test_add_bos_metadata_overrides_the_default() -> None:
    meta = dict(_metadata("llama-spm"), **{"tokenizer.ggml.add_bos_token": False})
    assert Tokenizer.from_gguf_metadata(meta).encode("Hello") == [15043]


def test_end_of_generation_tokens() -> None:
    assert {128001, 128009} <= vocab("llama-bpe").eog_ids  # <|end_of_text|>, <|eot_id|>
    qwen = vocab("qwen2")
    assert qwen.is_eog(qwen.token_id("<|im_end|>")) and qwen.is_eog(qwen.eos_id)
    assert not qwen.is_eog(qwen.token_id("<|im_start|>"))
    assert vocab("phi-3").eog_ids == {32000, 32007}  # <|endoftext|>, <|end|>
    assert vocab("bert-bge").eos_id is None


def test_token_to_piece() -> None:
    assert vocab("llama-spm").token_to_piece(15043) == " Hello"
    assert vocab("gpt-2").token_to_piece(15496) == "Hello"
    assert vocab("qwen2").token_to_piece(151645) == "<|im_end|>"
    assert vocab("llama-spm").token_to_bytes(vocab("llama-spm").token_id("<0x0A>")) == b"\n"


def test_skip_special_hides_control_tokens() -> None:
    tok = vocab("llama-bpe")
    ids = tok.encode("<|start_header_id|>user<|end_header_id|>", parse_special=True)
    assert tok.decode(ids, skip_special=True) == "user"
    assert tok.decode(ids) == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>"


# -- streaming ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2", "qwen2"])
@pytest.mark.parametrize("text", ["🦙 llamas 🚀🚀", "日本語のテキスト", "Ünïcödé ✓ 𝔘"])
def test_stream_decoder_yields_only_whole_characters(name: str, text: str) -> None:
    tok = vocab(name)
    ids = tok.encode(text, add_special=False)
    stream = StreamDecoder(tok)
    chunks = [stream.feed(i) for i in ids]
    chunks.append(stream.flush())
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    # each chunk is exactly the characters completed by that token: a partial one waits
    seen, done, expected = b"", 0, []
    for k, token_id in enumerate(ids):
        piece = tok.token_to_bytes(token_id)
        if k == 0 and name == "llama-spm":
            piece = piece.removeprefix(b" ")  # SentencePiece's prefix space is not text
        seen += piece
        end = len(seen) - _tail_len(seen)
        expected.append(seen[done:end].decode("utf-8"))
        done = end
    assert chunks[:-1] == expected


def _tail_len(data: bytes) -> int:
    """How many bytes at the end belong to an unfinished UTF-8 character."""
    n = 0  # continuation bytes (10xxxxxx) at the end
    while n < min(3, len(data)) and (data[-1 - n] & 0xC0) == 0x80:
        n += 1
    if n == len(data):
        return 0
    lead = data[-1 - n]
    need = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return n + 1 if need > n + 1 else 0


def test_stream_decoder_holds_back_the_bytes_of_an_emoji() -> None:
    tok = vocab("gpt-2")
    ids = tok.encode("🦙", add_special=False)
    assert len(ids) > 1  # gpt-2 has no token for it, so its 4 bytes come in pieces
    stream = StreamDecoder(tok)
    assert [stream.feed(i) for i in ids] == [""] * (len(ids) - 1) + ["🦙"]


def test_stream_decoder_flush_replaces_a_cut_character() -> None:
    tok = vocab("llama-spm")
    ids = tok.encode("🦙", add_special=False)
    stream = StreamDecoder(tok)
    assert "".join(stream.feed(i) for i in ids[:-1]) == ""
    assert stream.flush() == "\ufffd"


# -- errors -------------------------------------------------------------------------------------


def test_metadata_without_a_vocabulary_is_a_clear_error() -> None:
    with pytest.raises(TesseraError, match="no tokenizer"):
        Tokenizer.from_gguf_metadata({"general.architecture": "llama"})


def test_unknown_tokenizer_model_names_the_supported_ones() -> None:
    meta = {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(TokenizerError, match=r"'rwkv'.*gpt2, llama, bert"):
        Tokenizer.from_gguf_metadata(meta)


def test_unknown_pre_tokenizer_falls_back_to_gpt2_with_a_warning(caplog) -> None:
    meta = dict(_metadata("gpt-2"), **{"tokenizer.ggml.pre": "no-such-pre"})
    with caplog.at_level(logging.WARNING):
        tok = Tokenizer.from_gguf_metadata(meta)
    assert "no-such-pre" in caplog.text
    text, ids = _vectors("gpt-2")[10]
    assert tok.encode(text, add_special=False) == ids


def test_out_of_range_id_is_a_clear_error() -> None:
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        vocab("gpt-2").decode([10**9])


# -- Hugging Face folders --------------------------------------------------------------------

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


@pytest.mark.parametrize("lowercase", [True, False])
def test_wpm_ascii_fast_path_splits_like_the_general_one(lowercase: bool) -> None:
    import random

    from tessera.text.vocab_models import wpm_words, wpm_words_general

    rng = random.Random(0)
    alphabet = [chr(c) for c in range(128)]  # every ASCII character, controls included
    texts = ["Hello, World! x=1.5e-3 (a+b)*c; don't \x07stop\x1fnow\t\n"]
    texts += ["".join(rng.choices(alphabet, k=rng.randint(0, 60))) for _ in range(300)]
    for text in texts:
        assert text.isascii()
        assert wpm_words(text, lowercase) == wpm_words_general(text, lowercase), repr(text)

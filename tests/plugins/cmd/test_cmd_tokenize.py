"""``tessera tokenize``: output like llama.cpp's llama-tokenize, for GGUF files and HF folders."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.testing.commands import registered_command

VOCAB_DIR = Path(__file__).resolve().parents[2] / "data" / "vocab"
LLAMA_SPM = VOCAB_DIR / "ggml-vocab-llama-spm.gguf"
PHI3 = VOCAB_DIR / "ggml-vocab-phi-3.gguf"


def _command() -> Command:
    return registered_command("tessera.plugins.cmd.tokenize", "tokenize")


def _run(capsys, *argv: str) -> str:
    command = _command()
    parser = argparse.ArgumentParser(prog="tessera tokenize")
    command.add_arguments(parser)
    assert command.run(parser.parse_args(argv), None) == 0
    return capsys.readouterr().out


def test_prints_one_line_per_token_like_llama_tokenize(capsys) -> None:
    out = _run(capsys, "-m", str(LLAMA_SPM), "Hello world")
    assert out == "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n"


def test_ids_and_no_bos(capsys) -> None:
    assert _run(capsys, "-m", str(LLAMA_SPM), "Hello world", "--ids") == "[1, 15043, 3186]\n"
    assert _run(capsys, "-m", str(LLAMA_SPM), "Hello world", "--ids", "--no-bos") == (
        "[15043, 3186]\n"
    )


def test_parse_special(capsys) -> None:
    text = "<|user|>Hi"
    plain = _run(capsys, "-m", str(PHI3), text, "--ids", "--no-bos")
    parsed = _run(capsys, "-m", str(PHI3), text, "--ids", "--no-bos", "--parse-special")
    assert "32010" not in plain
    assert parsed.startswith("[32010, ")


def test_show_count(capsys) -> None:
    out = _run(capsys, "-m", str(LLAMA_SPM), "Hello world", "--show-count")
    assert out.endswith("Total number of tokens: 3\n")


def test_hf_folder(capsys, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    hf.train_from_iterator(["hello world, hello tokens"] * 20, trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    out = _run(capsys, "-m", str(tmp_path), "hello world", "--ids")
    assert out == f"{hf.encode('hello world').ids}\n"


def test_missing_model_is_a_tessera_error(capsys, tmp_path: Path) -> None:
    with pytest.raises(TesseraError, match="does not exist"):
        _run(capsys, "-m", str(tmp_path / "nope.gguf"), "x")

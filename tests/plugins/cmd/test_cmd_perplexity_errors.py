"""``tessera perplexity`` refusals: each bad input is one ``error:`` line that names the
problem and the way out, exit code 1, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera.cli.main import main
from tessera.plugins.cmd.kld_base import KLDBaseWriter, scored_rows
from tessera.testing import make_gguf

DATA = Path(__file__).resolve().parents[2] / "data" / "perplexity"
TEXT = DATA / "python-notes.txt"
LLAMA_BASE = DATA / "llama-f16-c32.kld"


def one_error(capsys, *argv: str) -> str:
    """Run the command, expect exit 1 and exactly one error line; return that line."""
    assert main(["perplexity", *argv]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err
    return errors[0]


def test_a_text_too_short_names_both_token_counts(capsys):
    line = one_error(capsys, "-f", str(TEXT), "-c", "2048")
    assert "has 2682 tokens" in line and "needs at least 4096" in line
    assert "pass a longer text or a smaller -c" in line


def test_no_text_and_an_unreadable_text(capsys, tmp_path):
    assert "pass -f FILE" in one_error(capsys)
    assert "cannot read text file" in one_error(capsys, "-f", str(tmp_path / "none.txt"))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 " * 2000)
    assert "is not UTF-8" in one_error(capsys, "-f", str(tmp_path / "latin1.txt"))


def test_kl_divergence_needs_a_base_file(capsys):
    line = one_error(capsys, "--kl-divergence")
    assert "--kl-divergence needs --kl-divergence-base FILE" in line


def test_a_base_file_in_a_missing_folder_is_refused_before_any_work(capsys, tmp_path):
    out = tmp_path / "no" / "base.kld"
    line = one_error(capsys, "-f", str(TEXT), "--kl-divergence-base", str(out))
    assert "does not exist; create it first" in line and not (tmp_path / "no").exists()


def test_a_damaged_base_file(capsys, tmp_path):
    bad = tmp_path / "bad.kld"
    bad.write_bytes(LLAMA_BASE.read_bytes()[:1000])
    line = one_error(capsys, "--kl-divergence-base", str(bad), "--kl-divergence")
    assert "is 1000 bytes but its header" in line and "write it again" in line


def test_a_context_size_other_than_the_base_file_s(capsys):
    line = one_error(capsys, "--kl-divergence-base", str(LLAMA_BASE), "--kl-divergence", "-c", "64")
    assert "-c 64 differs from the n_ctx 32" in line and "pass -c 32" in line


def test_a_text_other_than_the_base_file_s(capsys, tmp_path):
    other = tmp_path / "other.txt"
    text = TEXT.read_text(encoding="utf-8")
    other.write_text(text[:500] + "Something else entirely. " + text[500:], encoding="utf-8")
    line = one_error(
        capsys, "-f", str(other), "--kl-divergence-base", str(LLAMA_BASE), "--kl-divergence"
    )
    assert "differ from those in" in line and "leave -f out" in line
    assert "from token 1" in line  # somewhere after the first hundred tokens
    short = tmp_path / "short.txt"
    short.write_text(text[:300], encoding="utf-8")
    line = one_error(
        capsys, "-f", str(short), "--kl-divergence-base", str(LLAMA_BASE), "--kl-divergence"
    )
    assert "the file has 224" in line


def test_a_base_file_of_another_vocabulary(capsys, tmp_path):
    path = tmp_path / "v100.kld"
    with KLDBaseWriter(path, 8, 100, 1, np.arange(8)) as writer:
        writer.write_chunk(np.zeros((scored_rows(8), 100), np.float32))
    line = one_error(capsys, "--kl-divergence-base", str(path), "--kl-divergence")
    assert "over 100 tokens but the model has 4096" in line


def test_a_vocabulary_that_appends_eos_is_refused(capsys, tmp_path):
    model = make_gguf(
        tmp_path / "eos.gguf", metadata_overrides={"tokenizer.ggml.add_eos_token": True}
    )
    line = one_error(capsys, "-m", str(model), "-f", str(TEXT), "-c", "32")
    assert "appends EOS to every text" in line


@pytest.mark.parametrize("chunks", ["0", "-2", "x"])
def test_chunks_must_be_minus_one_or_a_count(capsys, chunks):
    with pytest.raises(SystemExit) as info:
        main(["perplexity", "-f", str(TEXT), "--chunks", chunks])
    assert info.value.code == 2
    assert "--chunks" in capsys.readouterr().err

"""llama-perplexity's KL-divergence base file: the layout read back by an independent
reader, stored log-probabilities against a float64 log-softmax, llama.cpp's own file read,
and refusals of damaged files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tessera.errors import TesseraError
from tessera.plugins.cmd.kld_base import (
    KLDBaseWriter,
    dequantize_log_probs,
    quantize_log_probs,
    read_kld_base,
    row_length,
    scored_rows,
)
from tessera.text.tokenizer import Tokenizer

DATA = Path(__file__).resolve().parents[2] / "data" / "perplexity"
LLAMA_BASE = DATA / "llama-f16-c32.kld"
DEFAULT_MODEL = Path(__file__).resolve().parents[3] / "core" / "default_model"


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def parse_by_hand(data: bytes) -> dict:
    """The layout as llama.cpp's perplexity.cpp writes it, read with struct alone."""
    assert data[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<3i", data, 8)
    n_tok = n_ctx * n_chunk
    tokens = struct.unpack_from(f"<{n_tok}i", data, 20)
    n_row = 2 * ((n_vocab + 1) // 2) + 4
    at = 20 + 4 * n_tok
    rows = []
    while at < len(data):
        scale, min_lp = struct.unpack_from("<2f", data, at)
        codes = struct.unpack_from(f"<{n_row - 4}H", data, at + 8)
        rows.append((scale, min_lp, codes))
        at += 2 * n_row
    assert at == len(data)
    return {"n_ctx": n_ctx, "n_vocab": n_vocab, "n_chunk": n_chunk, "tokens": tokens, "rows": rows}


@pytest.mark.parametrize("n_vocab", [7, 8])  # odd: a padding entry; even: none
def test_written_layout_and_values(tmp_path, n_vocab):
    rng = np.random.default_rng(n_vocab)
    n_ctx, n_chunk = 8, 2
    tokens = rng.integers(0, n_vocab, n_ctx * n_chunk + 5)  # a tail that fills no chunk
    chunks = [rng.normal(0, 6, (scored_rows(n_ctx), n_vocab)).astype(np.float32) for _ in "ab"]
    chunks[1][0] = 2.5  # a flat row: scale 0, every code 0
    with KLDBaseWriter(tmp_path / "b.kld", n_ctx, n_vocab, n_chunk, tokens) as w:
        for logits in chunks:
            w.write_chunk(logits)
    got = parse_by_hand((tmp_path / "b.kld").read_bytes())
    assert (got["n_ctx"], got["n_vocab"], got["n_chunk"]) == (n_ctx, n_vocab, n_chunk)
    assert list(got["tokens"]) == tokens[: n_ctx * n_chunk].tolist()
    assert len(got["rows"]) == n_chunk * scored_rows(n_ctx) == n_chunk * 3
    for (scale, min_lp, codes), logits in zip(got["rows"], np.concatenate(chunks), strict=True):
        exact = log_softmax64(logits[None])[0]
        assert codes[n_vocab:] == (0,) * (row_length(n_vocab) - 4 - n_vocab)
        lp = scale * np.array(codes[:n_vocab], dtype=np.float64) + min_lp
        if scale == 0:
            assert set(codes) == {0} and min_lp == pytest.approx(exact[0], abs=1e-6)
            continue
        assert scale == pytest.approx((logits.max() - max(logits.min(), logits.max() - 16)) / 65535)
        kept = exact >= exact.max() - 16
        # a code is the nearest step: within half a step, plus float32 rounding
        assert np.abs(lp[kept] - exact[kept]).max() <= scale / 2 + 1e-5
        assert np.all(lp[~kept] == min_lp)
        assert min_lp == pytest.approx(max(exact.min(), exact.max() - 16), abs=1e-5)


def test_reader_gives_back_what_was_written(tmp_path):
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, (2, scored_rows(10), 33)).astype(np.float32)
    tokens = rng.integers(0, 33, 20)
    with KLDBaseWriter(tmp_path / "b.kld", 10, 33, 2, tokens) as w:
        for chunk in logits:
            w.write_chunk(chunk)
    base = read_kld_base(tmp_path / "b.kld")
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (10, 33, 2)
    assert base.tokens.tolist() == tokens.tolist()
    for c in range(2):
        assert np.array_equal(base.chunk_rows(c), quantize_log_probs(logits[c]))
        stored = dequantize_log_probs(base.chunk_rows(c), 33)
        exact = log_softmax64(logits[c])
        kept = exact >= exact.max(axis=1, keepdims=True) - 16  # the rest are clipped
        assert np.abs(stored - exact)[kept].max() < 16 / 65535 / 2 + 1e-5


def test_reads_llama_perplexity_s_own_file():
    base = read_kld_base(LLAMA_BASE)
    assert (base.n_ctx, base.n_vocab, base.n_chunk) == (32, 4096, 7)
    text = (DATA / "python-notes.txt").read_text(encoding="utf-8")[:-1]
    tok = Tokenizer.from_path(DEFAULT_MODEL / "tessera-default.gguf")
    assert base.tokens.tolist() == tok.encode(text)[: 32 * 7]
    for c in range(base.n_chunk):
        lp = dequantize_log_probs(base.chunk_rows(c), 4096).astype(np.float64)
        assert lp.shape == (15, 4096)
        # log-probabilities: each row's mass is one, up to the 16-nat clip and the steps
        assert np.abs(np.log(np.exp(lp).sum(axis=1))).max() < 1e-3


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-2])


def _bad_magic(path: Path) -> None:
    path.write_bytes(b"_logitz_" + path.read_bytes()[8:])


def _zero_chunks(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[16:20] = struct.pack("<i", 0)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_truncate, "is 861914 bytes but its header .* needs 861916"),
        (_bad_magic, "does not look like a file of log-probabilities"),
        (_zero_chunks, "impossible sizes"),
    ],
)
def test_damaged_files_are_refused_with_the_way_out(tmp_path, damage, message):
    path = tmp_path / "base.kld"
    path.write_bytes(LLAMA_BASE.read_bytes())
    damage(path)
    with pytest.raises(TesseraError, match=message) as info:
        read_kld_base(path)
    assert "write it again" in str(info.value) and str(path) in str(info.value)


def test_a_missing_file_names_the_file(tmp_path):
    with pytest.raises(TesseraError, match="cannot read KL-divergence base file .*nope.kld"):
        read_kld_base(tmp_path / "nope.kld")


def test_writer_leaves_nothing_when_aborted_or_short(tmp_path):
    with pytest.raises(RuntimeError), KLDBaseWriter(tmp_path / "b.kld", 4, 5, 1, range(4)) as w:
        w.write_chunk(np.zeros((scored_rows(4), 5), np.float32))
        raise RuntimeError("interrupted")
    w = KLDBaseWriter(tmp_path / "c.kld", 4, 5, 2, range(8))
    with pytest.raises(ValueError, match="1 of 2 chunks"):
        w.write_chunk(np.zeros((scored_rows(4), 5), np.float32))
        w.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TesseraError, match="is a folder"):
        KLDBaseWriter(tmp_path, 4, 5, 1, range(4))
    with pytest.raises(TesseraError, match="does not exist; create it first"):
        KLDBaseWriter(tmp_path / "no" / "b.kld", 4, 5, 1, range(4))

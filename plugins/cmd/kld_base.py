"""llama-perplexity's KL-divergence base file (``--kl-divergence-base``), read and written.

The layout, in native byte order (little-endian on every machine llama.cpp runs on):

- the 8 bytes ``_logits_``;
- int32 ``n_ctx``, int32 ``n_vocab``, int32 ``n_chunk``;
- int32 ``tokens[n_chunk * n_ctx]``: the text's tokens as tokenized (no BOS substituted);
- per chunk, one row for each scored position (``n_ctx - 1 - n_ctx // 2`` rows), each row
  ``n_row = 2 * ((n_vocab + 1) // 2) + 4`` uint16: two float32 (``scale``, ``min_log_prob``)
  in the first four, then one uint16 per vocabulary entry, zero-padded to an even count.
  A log-probability is ``scale * q + min_log_prob``; values more than 16 below the row's
  top logit are clipped to ``min_log_prob`` (``q = 0``).

The quantization follows llama.cpp's float32 steps, so a file written here is what
llama-perplexity would write for the same logits and each program reads the other's files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO

import attrs
import numpy as np

from tessera.errors import TesseraError

MAGIC = b"_logits_"
HEADER_BYTES = len(MAGIC) + 3 * 4
#: Log-probabilities further below the row's maximum than this are not told apart.
LOG_PROB_RANGE = np.float32(16.0)


def row_length(n_vocab: int) -> int:
    """uint16 entries per stored row: the two float32 header values and the padded vocab."""
    return 2 * ((n_vocab + 1) // 2) + 4


def scored_rows(n_ctx: int) -> int:
    """Rows a chunk stores: positions ``n_ctx // 2`` to ``n_ctx - 2`` predict a next token."""
    return n_ctx - 1 - n_ctx // 2


def _nearest_int(values: np.ndarray) -> np.ndarray:
    # ggml adds 1.5 * 2**23 and keeps the mantissa: round half to even, as np.rint does
    return np.rint(values).astype(np.int64)


def quantize_log_probs(logits: np.ndarray) -> np.ndarray:
    """Rows of llama.cpp's stored log-softmax for float32 ``logits`` ``(R, n_vocab)``:
    uint16 ``(R, row_length(n_vocab))``."""
    logits = np.asarray(logits, dtype=np.float32)
    n_rows, n_vocab = logits.shape
    max_logit = logits.max(axis=1)
    min_logit = np.maximum(logits.min(axis=1), max_logit - LOG_PROB_RANGE)
    sum_exp = np.exp(logits - max_logit[:, None]).sum(axis=1, dtype=np.float64)
    log_sum_exp = np.log(sum_exp).astype(np.float32)
    min_log_prob = min_logit - max_logit - log_sum_exp
    scale = (max_logit - min_logit) / np.float32(65535)
    out = np.zeros((n_rows, row_length(n_vocab)), dtype=np.uint16)
    out[:, :4] = np.stack([scale, min_log_prob], axis=1).astype(np.float32).view(np.uint16)
    flat = scale == 0  # every logit equal: all codes stay 0
    inv_scale = np.float32(1) / np.where(flat, np.float32(1), scale)
    codes = _nearest_int(inv_scale[:, None] * (logits - min_logit[:, None]))
    codes[logits <= min_logit[:, None]] = 0
    codes[flat] = 0
    out[:, 4 : 4 + n_vocab] = codes
    return out


def dequantize_log_probs(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """The float32 log-probabilities ``(R, n_vocab)`` that stored rows stand for."""
    rows = np.ascontiguousarray(rows, dtype=np.uint16)
    header = rows[:, :4].copy().view(np.float32)
    scale, min_log_prob = header[:, 0:1], header[:, 1:2]
    return scale * rows[:, 4 : 4 + n_vocab].astype(np.float32) + min_log_prob


@attrs.frozen
class KLDBase:
    """An opened base file: its sizes, its tokens and the stored rows of each chunk."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray = attrs.field(eq=False, repr=False)
    _rows: np.ndarray = attrs.field(eq=False, repr=False)

    def chunk_rows(self, chunk: int) -> np.ndarray:
        """uint16 ``(scored_rows(n_ctx), row_length(n_vocab))`` of chunk ``chunk``."""
        return np.asarray(self._rows[chunk])


def _bad(path: Path, what: str) -> TesseraError:
    return TesseraError(
        f"'{path}' {what}; pass a file written by --kl-divergence-base (tessera or "
        "llama-perplexity), or write it again"
    )


def read_kld_base(path: str | os.PathLike[str]) -> KLDBase:
    """Open a base file, checking its magic, its sizes and that its length matches them."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as exc:
        raise TesseraError(
            f"cannot read KL-divergence base file '{path}' ({exc.strerror}); pass the file "
            "written by --kl-divergence-base without --kl-divergence"
        ) from exc
    if len(head) < HEADER_BYTES or head[: len(MAGIC)] != MAGIC:
        raise _bad(path, "does not look like a file of log-probabilities (no _logits_ header)")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(head[len(MAGIC) :], dtype="<i4"))
    if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        raise _bad(
            path, f"has impossible sizes (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})"
        )
    n_row = row_length(n_vocab)
    rows_at = HEADER_BYTES + 4 * n_ctx * n_chunk
    expected = rows_at + 2 * n_chunk * scored_rows(n_ctx) * n_row
    size = path.stat().st_size
    if size != expected:
        raise _bad(
            path,
            f"is {size} bytes but its header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk "
            f"{n_chunk}) needs {expected}: it is truncated or not such a file",
        )
    tokens = np.fromfile(path, dtype="<i4", count=n_ctx * n_chunk, offset=HEADER_BYTES)
    rows = np.memmap(
        path,
        dtype="<u2",
        mode="r",
        offset=rows_at,
        shape=(n_chunk, scored_rows(n_ctx), n_row),
    )
    return KLDBase(path, n_ctx, n_vocab, n_chunk, tokens.astype(np.int32), rows)


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, refused when it is a folder or its folder does not exist."""
    path = Path(path)
    if path.is_dir():
        raise TesseraError(f"'{path}' is a folder; pass the path of the file to write")
    if not path.parent.is_dir():
        raise TesseraError(
            f"folder '{path.parent}' does not exist; create it first or write elsewhere"
        )
    return path


class KLDBaseWriter:
    """Writes a base file to a temporary name beside ``path``; :meth:`close` renames it into
    place, :meth:`abort` (or leaving a ``with`` block by an exception) removes it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        n_ctx: int,
        n_vocab: int,
        n_chunk: int,
        tokens: np.ndarray,
    ) -> None:
        self.path = check_output_path(path)
        tokens = np.ascontiguousarray(tokens, dtype="<i4")
        if n_chunk < 1 or len(tokens) < n_chunk * n_ctx:
            raise ValueError(f"{len(tokens)} tokens do not fill {n_chunk} chunks of {n_ctx}")
        self.n_ctx, self.n_vocab, self.n_chunk = n_ctx, n_vocab, n_chunk
        fd, self._tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self._file.write(MAGIC)
        self._file.write(np.array([n_ctx, n_vocab, self.n_chunk], dtype="<i4").tobytes())
        self._file.write(tokens[: n_chunk * n_ctx].tobytes())
        self._chunks_written = 0

    def write_chunk(self, logits: np.ndarray) -> None:
        """Store one chunk's scored logits ``(scored_rows(n_ctx), n_vocab)``."""
        if logits.shape != (scored_rows(self.n_ctx), self.n_vocab):
            raise ValueError(f"a chunk has {scored_rows(self.n_ctx)} rows of {self.n_vocab}")
        self._file.write(quantize_log_probs(logits).astype("<u2").tobytes())
        self._chunks_written += 1

    def close(self) -> None:
        self._file.close()
        if self._chunks_written != self.n_chunk:
            os.unlink(self._tmp)
            raise ValueError(f"{self._chunks_written} of {self.n_chunk} chunks were written")
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __enter__(self) -> KLDBaseWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

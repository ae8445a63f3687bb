"""Architecture conformance kit: an architecture plugin makes, loads and runs real models.

:func:`architecture_checks` returns named checks (ids such as ``llama-numpy-forward``) over
one random-weight GGUF file that :func:`tessera.testing.models.make_gguf` writes from the
plugin's own ``example_config``:

- ``make-gguf``: the file is written, names the architecture and loads on the backend;
- ``forward``: a prompt gives finite logits ``(T, n_vocab)`` for every row;
- ``kv-cache``: decoding the last token after the others (reading the KV cache) gives
  the logits of the same row in one full pass, within the backend's error budget;
- ``parity`` (only when a reference is given): ``reference(path, tokens)`` returns float
  logits ``(T, n_vocab)`` of the same file from another implementation (e.g. HF
  ``transformers`` on the folder the file was converted from) and tessera matches it.

Errors are relative: the largest absolute difference over the largest reference logit.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tessera.testing.quant import Check

#: Relative logit error allowed per compute dtype (kv-cache and parity checks).
LOGIT_TOLERANCE = {"f32": 1e-4, "f16": 2e-2, "bf16": 5e-2}
#: Token count of the check prompt: more than one ubatch row, fewer than any vocabulary.
N_TOKENS = 9


class ArchitectureSubject:
    """One test model of architecture ``arch`` on one backend, made on first use."""

    def __init__(self, runtime: Any, arch: str, backend: str, dtype: str | None, dims: dict):
        self.runtime, self.arch, self.backend_name, self.dtype = runtime, arch, backend, dtype
        self.dims = dims
        self._tmp = tempfile.TemporaryDirectory(prefix="tessera-arch-")

    @functools.cached_property
    def path(self) -> Path:
        from tessera.testing.models import make_gguf

        return make_gguf(
            Path(self._tmp.name) / f"{self.arch}.gguf", self.arch, runtime=self.runtime, **self.dims
        )

    @functools.cached_property
    def model(self) -> Any:
        from tessera.files.load import load_model

        return load_model(self.path, self.runtime, self.backend_name, dtype=self.dtype)

    @functools.cached_property
    def tokens(self) -> np.ndarray:
        rng = np.random.default_rng(0)
        return rng.integers(0, self.model.n_vocab, N_TOKENS).astype(np.int32)

    def logits(self, split: int | None = None) -> np.ndarray:
        """Logits of every row in one pass, or of the last row after ``split`` tokens."""
        from tessera.engine.batch import Batch
        from tessera.engine.context import Context, ContextParams

        ctx = Context(self.model, ContextParams(n_ctx=32, n_ubatch=8))
        if split is None:
            return ctx.decode(Batch.for_sequence(self.tokens, logits="all"))
        ctx.decode(Batch.for_sequence(self.tokens[:split], logits="none"))
        return ctx.decode(Batch.for_sequence(self.tokens[split:], start_pos=split, logits="all"))

    @property
    def tolerance(self) -> float:
        return LOGIT_TOLERANCE.get(self.model.backend.dtype, LOGIT_TOLERANCE["bf16"])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    return float(diff.max() / max(float(np.abs(want).max()), 1e-30))


def _make_gguf(s: ArchitectureSubject) -> None:
    from tessera.files.gguf import read_gguf

    assert read_gguf(s.path).architecture == s.arch, f"{s.path} does not name {s.arch}"
    assert s.model.arch is s.runtime.architecture(s.arch)
    assert s.model.backend.name == s.backend_name


def _forward(s: ArchitectureSubject) -> None:
    logits = s.logits()
    assert logits.shape == (N_TOKENS, s.model.n_vocab), f"logits have shape {logits.shape}"
    assert np.all(np.isfinite(logits)), "the logits hold NaN or infinity"
    assert np.ptp(logits, axis=1).min() > 0, "a row of logits is constant"


def _kv_cache(s: ArchitectureSubject) -> None:
    full = s.logits()
    split = s.logits(split=N_TOKENS - 2)
    error = relative_error(split, full[-2:])
    assert error <= s.tolerance, (
        f"decoding after a cached prefix differs from one full pass: relative error "
        f"{error:.3g} (budget {s.tolerance:g}); the KV cache is written or read wrongly"
    )


def _parity(s: ArchitectureSubject, reference: Callable[[Path, np.ndarray], Any], tol: float):
    want = np.asarray(reference(s.path, s.tokens), dtype=np.float32)
    got = s.logits()
    assert want.shape == got.shape, f"reference logits {want.shape}, tessera {got.shape}"
    error = relative_error(got, want)
    assert error <= tol, f"logits differ from the reference: relative error {error:.3g} > {tol:g}"


def architecture_checks(
    runtime: Any,
    arch: str,
    *,
    backend: str = "numpy",
    dtype: str | None = None,
    reference: Callable[[Path, np.ndarray], Any] | None = None,
    tolerance: float | None = None,
    **dims: Any,
) -> list[Check]:
    """The checks for architecture ``arch`` (a GGUF name) on ``backend``.

    ``dims`` go to ``make_gguf`` (``n_embd``, ``n_head_kv``, ``size`` ...); ``tolerance``
    overrides the parity budget (default :data:`LOGIT_TOLERANCE` for the dtype).
    """
    s = ArchitectureSubject(runtime, arch, backend, dtype, dims)
    prefix = f"{arch}-{backend}" + (f"-{dtype}" if dtype else "")
    checks = [
        Check(f"{prefix}-make-gguf", lambda: _make_gguf(s)),
        Check(f"{prefix}-forward", lambda: _forward(s)),
        Check(f"{prefix}-kv-cache", lambda: _kv_cache(s)),
    ]
    if reference is not None:
        checks.append(
            Check(
                f"{prefix}-parity",
                lambda: _parity(s, reference, s.tolerance if tolerance is None else tolerance),
            )
        )
    return checks

"""Quant-type conformance kit: the facts every :class:`~tessera.contract.quant.QuantType` must keep.

:func:`quant_checks` returns named checks (stable ids, e.g. ``EX_I8-round-trip``); each
raises ``AssertionError`` with a message naming what broke:

- ``layout``: ``block_size`` and ``type_size`` are positive, ``row_bytes`` agrees with
  them and refuses a row that does not fill whole blocks;
- ``shapes``: ``quantize`` maps float32 ``(..., n)`` to uint8 ``(..., row_bytes(n))`` and
  ``dequantize`` maps it back to float32 ``(..., n)``, for 1-D and 2-D inputs;
- ``zeros``: all-zero blocks come back as zeros (no NaN from a zero scale);
- ``round-trip``: the relative RMS error of ``dequantize(quantize(x))``, per row of normal
  data with very different scales (``row_scales``), stays within ``max_error``;
- ``gguf-file``: a tensor written to a GGUF file, read back and sized as the loader
  sizes it decodes to the same values (this catches a type id the runtime cannot find);
- ``reference-quantize`` / ``reference-dequantize`` (only when a reference is given):
  bit-exact agreement with another implementation, e.g. ``gguf.quants``.

A ``read_only`` type (one tessera decodes but cannot encode) has no round trip: its checks
run on stored bytes (``sample_bytes``, default random bytes): ``shapes`` and
``reference-dequantize`` decode them, ``zeros`` decodes all-zero bytes (zero scales),
``gguf-file`` writes them, and ``refuses-quantize`` checks that ``quantize`` raises
:class:`~tessera.errors.TesseraError`.

No pytest is needed here; :mod:`tessera.testing.pytest_plugin` turns the checks into tests.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np


@attrs.frozen
class Check:
    """One named check; ``run()`` raises AssertionError when the plugin breaks the fact."""

    id: str
    run: Callable[[], None] = attrs.field(eq=False, repr=False)


def default_max_error(qtype: Any) -> float:
    """The round-trip budget when the author gives none: ``2 ** (3 - bits per weight)``,
    at least ``2 ** -8`` (loose enough for every GGML type, tight enough to catch a
    broken scale or bit order)."""
    bits = 8.0 * qtype.type_size / qtype.block_size
    return max(2.0 ** (3.0 - bits), 2.0**-8)


#: Standard deviations of the rows of :func:`sample_values` (block-scaled types keep
#: every one; a type without scales, such as FP8, passes the range it represents).
ROW_SCALES = (1e-3, 4.6e-2, 2.2, 1e2)


def sample_values(
    qtype: Any, n_blocks: int = 8, seed: int = 0, row_scales: tuple[float, ...] = ROW_SCALES
) -> np.ndarray:
    """Normal float32 values ``(len(row_scales), n_blocks * block_size)``, row ``i`` with
    standard deviation ``row_scales[i]``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((len(row_scales), n_blocks * qtype.block_size)).astype(np.float32)
    return x * np.asarray(row_scales, dtype=np.float32)[:, None]


def _layout(qtype: Any) -> None:
    assert qtype.block_size > 0 and qtype.type_size > 0, (
        f"block_size {qtype.block_size} and type_size {qtype.type_size} must be positive"
    )
    for n_blocks in (1, 3):
        got = qtype.row_bytes(n_blocks * qtype.block_size)
        assert got == n_blocks * qtype.type_size, (
            f"row_bytes({n_blocks * qtype.block_size}) is {got}, expected "
            f"{n_blocks} blocks * type_size {qtype.type_size}"
        )
    if qtype.block_size > 1:
        try:
            qtype.row_bytes(qtype.block_size + 1)
        except ValueError:
            return
        raise AssertionError(f"row_bytes({qtype.block_size + 1}) accepted a partial block")


def _shapes(qtype: Any) -> None:
    x = sample_values(qtype, n_blocks=2)[:3]
    for values in (x, x[0]):
        data = qtype.quantize(values)
        want = (*values.shape[:-1], qtype.row_bytes(values.shape[-1]))
        assert data.dtype == np.uint8, f"quantize returned {data.dtype}, expected uint8"
        assert data.shape == want, f"quantize of {values.shape} gave {data.shape}, expected {want}"
        back = qtype.dequantize(data)
        assert back.dtype == np.float32, f"dequantize returned {back.dtype}, expected float32"
        assert back.shape == values.shape, (
            f"dequantize of {data.shape} gave {back.shape}, expected {values.shape}"
        )


def random_bytes(qtype: Any, n_blocks: int = 8, seed: int = 0, n_rows: int = 4) -> np.ndarray:
    """Random ``uint8`` bytes ``(n_rows, n_blocks * type_size)``: stored blocks of a read-only
    type (any bit pattern, so float16 scales may be infinite or NaN)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n_rows, n_blocks * qtype.type_size), dtype=np.uint8)


def _decode(dequantize: Callable[[np.ndarray], np.ndarray], data: np.ndarray) -> np.ndarray:
    # Random bytes hold infinite and NaN scales: their products are expected, not warnings.
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(dequantize(data))


def _decoded_shapes(qtype: Any, data: np.ndarray) -> None:
    for stored in (data, data[0]):
        back = _decode(qtype.dequantize, stored)
        want = (*stored.shape[:-1], stored.shape[-1] // qtype.type_size * qtype.block_size)
        assert back.dtype == np.float32, f"dequantize returned {back.dtype}, expected float32"
        assert back.shape == want, (
            f"dequantize of {stored.shape} gave {back.shape}, expected {want}"
        )


def _refuses_quantize(qtype: Any) -> None:
    from tessera.errors import TesseraError

    try:
        qtype.quantize(sample_values(qtype, n_blocks=1)[:1])
    except TesseraError:
        return
    except Exception as exc:
        raise AssertionError(
            f"a read_only type's quantize must raise TesseraError saying why, not {exc!r}"
        ) from exc
    raise AssertionError("a read_only type's quantize must raise TesseraError saying why")


def _zeros(qtype: Any) -> None:
    if qtype.read_only:
        back = qtype.dequantize(np.zeros((2, 2 * qtype.type_size), np.uint8))
        assert np.all(back == 0), "all-zero bytes (zero scales) did not decode to zeros"
        return
    back = qtype.dequantize(qtype.quantize(np.zeros((2, 2 * qtype.block_size), np.float32)))
    assert np.all(back == 0), "all-zero blocks did not come back as zeros"


def _round_trip(qtype: Any, max_error: float, row_scales: tuple[float, ...]) -> None:
    x = sample_values(qtype, row_scales=row_scales).astype(np.float64)
    back = qtype.dequantize(qtype.quantize(x.astype(np.float32))).astype(np.float64)
    # Per row, so that the rows of small values count as much as the large ones.
    err = np.sqrt(np.mean((back - x) ** 2, axis=1) / np.mean(x**2, axis=1))
    worst = float(err.max())
    assert np.all(np.isfinite(back)), "dequantize(quantize(x)) has NaN or infinity"
    assert worst <= max_error, (
        f"relative RMS round-trip error {worst:.3g} exceeds the budget {max_error:.3g}"
    )


def _gguf_file(qtype: Any, runtime: Any) -> None:
    from tessera.files.gguf import RawTensor, read_gguf
    from tessera.files.gguf_writer import encode_tensor, write_gguf
    from tessera.files.load import stored_tensor

    found = runtime.quant_type(qtype.ggml_type)
    assert found.name == qtype.name, (
        f"GGML type {qtype.ggml_type} resolves to {found.name}, not {qtype.name}: another "
        "plugin registered the id first (see conflicts in `tessera plugins`)"
    )
    # Three rows of three blocks: a byte count that is rarely a multiple of the alignment.
    if qtype.read_only:
        data = random_bytes(qtype, n_blocks=3, seed=1)[:3]
        shape = (3, 3 * qtype.block_size)
        tensors = [RawTensor("a", qtype.ggml_type, shape, data.reshape(-1))]
        tensors.append(RawTensor("b", qtype.ggml_type, (1, shape[1]), data[:1].reshape(-1)))
    else:
        x = sample_values(qtype, n_blocks=3, seed=1)[:3]
        tensors = [encode_tensor("a", x, qtype), encode_tensor("b", x[:1], qtype)]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(Path(tmp) / "q.gguf", {"general.architecture": "check"}, tensors)
        read = read_gguf(path)
        for want in tensors:
            raw = stored_tensor(read.tensors[want.name], found)
            assert raw.ggml_type == qtype.ggml_type and raw.shape == want.shape
            assert np.array_equal(raw.data, want.data), (
                f"tensor '{want.name}' read back from a GGUF file has other bytes"
            )


def _bit_exact(name: str, got: np.ndarray, want: np.ndarray) -> None:
    # Compared as bytes: a reference may return its codes typed (gguf.quants gives F16 as
    # float16), while a QuantType returns uint8.
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape[:-1] == want.shape[:-1] and got.nbytes == want.nbytes, (
        f"{name}: shape {got.shape} {got.dtype}, reference {want.shape} {want.dtype}"
    )
    differ = got.reshape(-1).view(np.uint8) != want.reshape(-1).view(np.uint8)
    assert not differ.any(), f"{name}: {int(differ.sum())} bytes differ from the reference"


def quant_checks(
    qtype: Any,
    runtime: Any,
    *,
    max_error: float | None = None,
    reference_quantize: Callable[[np.ndarray], np.ndarray] | None = None,
    reference_dequantize: Callable[[np.ndarray], np.ndarray] | None = None,
    row_scales: tuple[float, ...] = ROW_SCALES,
    sample_bytes: np.ndarray | None = None,
) -> list[Check]:
    """The checks for ``qtype``; references take the same arguments as its own functions.

    ``row_scales`` are the magnitudes the round trip is measured at (see :data:`ROW_SCALES`).
    ``sample_bytes`` (``uint8`` rows of whole blocks) are the stored bytes a ``read_only``
    type's checks decode, e.g. blocks written by llama.cpp; default :func:`random_bytes`.
    """
    if qtype.read_only:
        return _read_only_checks(qtype, runtime, reference_dequantize, sample_bytes)
    budget = default_max_error(qtype) if max_error is None else max_error
    checks = [
        Check(f"{qtype.name}-layout", lambda: _layout(qtype)),
        Check(f"{qtype.name}-shapes", lambda: _shapes(qtype)),
        Check(f"{qtype.name}-zeros", lambda: _zeros(qtype)),
        Check(f"{qtype.name}-round-trip", lambda: _round_trip(qtype, budget, row_scales)),
        Check(f"{qtype.name}-gguf-file", lambda: _gguf_file(qtype, runtime)),
    ]
    x = sample_values(qtype, seed=2)
    if reference_quantize is not None:
        checks.append(
            Check(
                f"{qtype.name}-reference-quantize",
                lambda: _bit_exact("quantize", qtype.quantize(x), reference_quantize(x)),
            )
        )
    if reference_dequantize is not None:
        checks.append(
            Check(
                f"{qtype.name}-reference-dequantize",
                lambda: _bit_exact(
                    "dequantize",
                    qtype.dequantize(qtype.quantize(x)),
                    np.asarray(reference_dequantize(qtype.quantize(x)), dtype=np.float32),
                ),
            )
        )
    return checks


def _read_only_checks(
    qtype: Any,
    runtime: Any,
    reference_dequantize: Callable[[np.ndarray], np.ndarray] | None,
    sample_bytes: np.ndarray | None,
) -> list[Check]:
    data = random_bytes(qtype, seed=2) if sample_bytes is None else np.asarray(sample_bytes)
    checks = [
        Check(f"{qtype.name}-layout", lambda: _layout(qtype)),
        Check(f"{qtype.name}-shapes", lambda: _decoded_shapes(qtype, data)),
        Check(f"{qtype.name}-zeros", lambda: _zeros(qtype)),
        Check(f"{qtype.name}-refuses-quantize", lambda: _refuses_quantize(qtype)),
        Check(f"{qtype.name}-gguf-file", lambda: _gguf_file(qtype, runtime)),
    ]
    if reference_dequantize is not None:
        checks.append(
            Check(
                f"{qtype.name}-reference-dequantize",
                lambda: _bit_exact(
                    "dequantize",
                    _decode(qtype.dequantize, data),
                    _decode(reference_dequantize, data).astype(np.float32),
                ),
            )
        )
    return checks

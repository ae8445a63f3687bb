"""Backend conformance kit: every core op of a backend checked against the numpy reference.

Each :class:`Case` is one op with fixed shapes and parameters and a stable id (e.g.
``rope-neox-T7-H4-D64-R32``, filterable with ``pytest -k``). :func:`run_case` runs it on the
backend under test and on the reference backend (``numpy``, created through the runtime),
feeding the reference the very values the backend holds after ``from_numpy``, and compares
with a per-op, per-dtype error budget (:data:`TOLERANCES`): the largest absolute
difference divided by the largest reference magnitude. Some cases also check facts that
need no reference (a fully masked query gives zeros; ``set_rows`` leaves other rows
alone). A case the backend declines through ``supports(op, **case.probe)`` is reported as
"not supported", which is an outcome, not a failure.

A backend author reuses the kit in a test module of their own::

    import pytest
    from tessera.plugin_manager import Runtime
    from tessera.testing.conformance.kit import check_case, conformance_cases

    RUNTIME = Runtime()

    @pytest.fixture(scope="module")
    def backend():
        b = RUNTIME.create_backend("mybackend", dtype="f32")
        RUNTIME.equip(b)
        return b

    @pytest.mark.parametrize("case", conformance_cases(RUNTIME), ids=lambda c: c.id)
    def test_conformance(backend, case):
        check_case(backend, case, RUNTIME)
"""

from __future__ import annotations

import math
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from tessera.contract.backend import Backend
from tessera.contract.ops import Op
from tessera.files.gguf import RawTensor

#: Error budget per compute dtype and op ("default" for ops not named).
TOLERANCES: dict[str, dict[str, float]] = {
    "f32": {
        "default": 1e-5,
        "matmul": 1e-4,
        "attention": 1e-4,
        "attention_rows": 1e-4,
        "attention_softcap": 1e-4,
        "rope": 2e-5,
        "rope_ext": 2e-5,
        "moe_ffn": 1e-4,
        "matmul_n": 1e-4,
        "gate_up_swiglu": 1e-4,
        "llama-decoder": 1e-4,
        "kv_cache": 1e-4,
    },
    "f16": {
        "default": 2e-3,
        "matmul": 1e-2,
        "attention": 1e-2,
        "attention_rows": 1e-2,
        "attention_softcap": 1e-2,
        "rope": 4e-3,
        "rope_ext": 4e-3,
        "moe_ffn": 1e-2,
        "matmul_n": 1e-2,
        "gate_up_swiglu": 1e-2,
        "llama-decoder": 1e-2,
        "kv_cache": 1e-2,
    },
    "bf16": {
        "default": 1e-2,
        "matmul": 2e-2,
        "attention": 2e-2,
        "attention_rows": 2e-2,
        "attention_softcap": 2e-2,
        "rope": 2e-2,
        "rope_ext": 2e-2,
        "moe_ffn": 3e-2,
        "matmul_n": 2e-2,
        "gate_up_swiglu": 2e-2,
        "llama-decoder": 3e-2,
        "kv_cache": 2e-2,
    },
}


@attrs.frozen
class Weight:
    """A weight input: float values stored as ``qtype`` and loaded with ``load_weight``."""

    values: np.ndarray = attrs.field(eq=False, repr=False)
    qtype: Any

    def raw(self, name: str) -> RawTensor:
        data = self.qtype.quantize_tensor(self.values)
        return RawTensor(name, self.qtype.ggml_type, self.values.shape, data)


@attrs.frozen
class Case:
    """One op with fixed inputs.

    ``probe`` holds the attrs given to ``supports(op, **probe)``; ``make(rng)`` builds the
    inputs (numpy arrays, ints, :class:`Weight`); ``call(backend, args)`` runs the op on
    loaded inputs; ``check(got, args)`` (optional) returns a message when the output breaks
    a fact that needs no reference.
    """

    id: str
    op: str
    probe: dict[str, Any] = attrs.field(eq=False)
    make: Callable[[np.random.Generator], dict[str, Any]] = attrs.field(eq=False, repr=False)
    call: Callable[[Backend, dict[str, Any]], Any] = attrs.field(eq=False, repr=False)
    out_shape: tuple[int, ...] = ()
    check: Callable[[np.ndarray, dict[str, Any]], str | None] | None = attrs.field(
        default=None, eq=False, repr=False
    )
    #: Whether the backend offers the case's path; None: ``supports(op, **probe)``.
    supported: Callable[[Backend], bool] | None = attrs.field(default=None, eq=False, repr=False)

    def inputs(self) -> dict[str, Any]:
        """The case's inputs, the same on every run (seeded by the case id)."""
        return self.make(np.random.default_rng(zlib.crc32(self.id.encode())))


@attrs.frozen
class CaseResult:
    """Outcome of one case: ``status`` is "ok", "fail" or "not supported"."""

    case_id: str
    status: str
    error: float = 0.0
    tolerance: float = 0.0
    message: str = ""


def tolerance(op: str, dtype: str) -> float:
    budget = TOLERANCES.get(dtype, TOLERANCES["bf16"])
    return budget.get(op, budget["default"])


def _load(backend: Backend, args: dict[str, Any], as_seen_by: Backend | None) -> dict[str, Any]:
    """Inputs as ``backend`` arrays; floats first rounded through ``as_seen_by`` if given."""
    out: dict[str, Any] = {}
    for name, value in args.items():
        if isinstance(value, Weight):
            out[name] = backend.load_weight(value.raw(name), value.qtype)
        elif isinstance(value, np.ndarray) and value.dtype.kind == "f":
            if as_seen_by is not None:
                value = as_seen_by.to_numpy(as_seen_by.from_numpy(value))
            out[name] = backend.from_numpy(value)
        else:
            out[name] = value
    return out


def case_offered(backend: Backend, case: Case) -> bool:
    """Whether ``backend`` takes ``case``: the case's own predicate (e.g. a KV storage type
    the backend must hold) where it has one, else the backend's probe of its op."""
    if case.supported is not None:
        return case.supported(backend)
    return backend.supports(Op(case.op, case.probe, backend.dtype))


def run_case(backend: Backend, case: Case, reference: Backend) -> CaseResult:
    """Run ``case`` on ``backend`` and ``reference`` and compare them (no pytest needed)."""
    if not case_offered(backend, case):
        return CaseResult(case.id, "not supported", message=f"{backend.name} declined {case.id}")
    args = case.inputs()
    got = backend.to_numpy(case.call(backend, _load(backend, args, None)))
    want = reference.to_numpy(case.call(reference, _load(reference, args, backend)))
    tol = tolerance(case.op, backend.dtype)
    if got.shape != case.out_shape or want.shape != case.out_shape:
        return CaseResult(
            case.id,
            "fail",
            math.inf,
            tol,
            f"shape {got.shape} (reference {want.shape}), expected {case.out_shape}",
        )
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return CaseResult(case.id, "fail", math.inf, tol, "NaN where the reference has none")
    if case.check is not None and (broken := case.check(got, args)):
        return CaseResult(case.id, "fail", math.inf, tol, broken)
    diff = np.nan_to_num(np.abs(got.astype(np.float64) - want), nan=0.0)
    error = float(diff.max(initial=0.0) / max(float(np.nanmax(np.abs(want))), 1e-30))
    status = "ok" if error <= tol else "fail"
    message = f"relative max error {error:.3g} (budget {tol:g})"
    return CaseResult(case.id, status, error, tol, message)


_REFERENCES: weakref.WeakKeyDictionary[Any, Backend] = weakref.WeakKeyDictionary()


def reference_backend(runtime: Any) -> Backend:
    """The runtime's ``numpy`` reference backend (made once per runtime)."""
    if runtime not in _REFERENCES:
        _REFERENCES[runtime] = runtime.create_backend("numpy")
    return _REFERENCES[runtime]


def check_case(backend: Backend, case: Case, runtime: Any) -> None:
    """pytest helper: skip as "not supported" when the backend declines, else assert."""
    import pytest

    result = run_case(backend, case, reference_backend(runtime))
    if result.status == "not supported":
        # A declined probe is a real outcome (the core falls back), not a failed check.
        pytest.skip(f"not supported: {result.message}")
    assert result.status == "ok", f"{case.id} on {backend.name}/{backend.dtype}: {result.message}"


def conformance_cases(runtime: Any) -> list[Case]:
    """Every case, including matmul/get_rows for each quant type the runtime has and can
    write: a case makes its weights by quantizing values, which a ``read_only`` type
    cannot (the backend dequantizes such weights, as for any type without a kernel)."""
    from tessera.testing.conformance.cases import all_cases

    qtypes = sorted(
        (q for q in runtime.quant_types().values() if not q.read_only), key=lambda q: q.name
    )
    return all_cases(qtypes)

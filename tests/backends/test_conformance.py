"""The backend conformance kit run for the numpy reference and the torch backend (CPU)."""

from __future__ import annotations

import pytest

from tessera.plugin_manager import Runtime
from tessera.testing.conformance.kit import check_case, conformance_cases

RUNTIME = Runtime()
CASES = conformance_cases(RUNTIME)
SETTINGS = [("numpy", None), ("torch", "f32"), ("torch", "bf16")]


@pytest.fixture(scope="module", params=SETTINGS, ids=lambda s: f"{s[0]}-{s[1] or 'f32'}")
def backend(request):
    name, dtype = request.param
    b = RUNTIME.create_backend(name, device="cpu", dtype=dtype)
    RUNTIME.equip(b)
    return b


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_matches_reference(backend, case):
    check_case(backend, case, RUNTIME)


def test_every_core_op_and_quant_type_has_cases():
    from tessera.contract.backend import CORE_OPS, OPTIONAL_OPS
    from tessera.contract.fusion import BLOCK_KINDS

    assert {c.op for c in CASES} == set(CORE_OPS + OPTIONAL_OPS + BLOCK_KINDS)
    covered = {c.probe["quant_type"] for c in CASES if c.op == "matmul"}
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0"} <= covered
    assert len({c.id for c in CASES}) == len(CASES)

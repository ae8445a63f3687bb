"""tessera's pytest plugin: the kits pass on the built-ins and name what a broken plugin breaks."""

from __future__ import annotations

import textwrap

import gguf
import numpy as np
import pytest

# pytester's in-process runs drop the modules they imported when they end; torch (a C
# extension) cannot be imported twice in one process, so import it before any such run.
import torch  # noqa: F401

from tessera.contract.quant import QuantType
from tessera.plugin_manager import Runtime
from tessera.testing.pytest_plugin import default_runtime
from tessera.testing.quant import quant_checks

pytest_plugins = ["pytester"]


def test_the_plugin_is_registered_for_pytest(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("tessera")


def test_fixtures_share_one_runtime(tessera_runtime, tessera_reference_backend):
    assert tessera_runtime is default_runtime()
    assert tessera_reference_backend.name == "numpy"
    assert "llama" in tessera_runtime.architectures()


def test_make_gguf_fixture_writes_loadable_files(tessera_make_gguf, tessera_runtime):
    from tessera.files.load import load_model

    path = tessera_make_gguf("qwen3", qtype="q8_0")
    assert load_model(path, tessera_runtime, "numpy").config.arch == "qwen3"


def run_kit(pytester, source: str, *args: str):
    pytester.makepyfile(test_kit=textwrap.dedent(source))
    return pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider", *args)


def test_kits_pass_on_the_builtin_plugins(pytester):
    result = run_kit(
        pytester,
        """
        import gguf
        from gguf import GGMLQuantizationType as T
        from tessera.testing.pytest_plugin import (
            architecture_conformance, backend_conformance, quant_type_conformance,
        )

        test_numpy = backend_conformance("numpy")
        test_q4_0 = quant_type_conformance(
            "Q4_0",
            reference_quantize=lambda x: gguf.quants.quantize(x, T.Q4_0),
            reference_dequantize=lambda b: gguf.quants.dequantize(b, T.Q4_0),
        )
        test_qwen3 = architecture_conformance("qwen3")
        """,
        "-m",
        "tessera_conformance",
    )
    # Every case numpy's probe accepts passes, the others are "not supported"; plus the 7
    # quant checks (5 facts, 2 references) and the 3 architecture checks.
    from tessera.testing.conformance.kit import case_offered, conformance_cases

    rt = default_runtime()
    cases = conformance_cases(rt)
    numpy_backend = rt.create_backend("numpy")
    supported = sum(case_offered(numpy_backend, c) for c in cases)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, outcomes
    assert outcomes["passed"] + outcomes["skipped"] == len(cases) + 7 + 3, outcomes
    assert outcomes["passed"] == supported + 10, (outcomes, supported)
    # Stable ids: one family can be selected with -k.
    result = run_kit(
        pytester,
        "from tessera.testing.pytest_plugin import backend_conformance\n"
        "test_numpy = backend_conformance('numpy')\n",
        "-k",
        "rope-neox and far",
    )
    picked = [c for c in cases if c.id.startswith("rope-neox") and "far" in c.id]
    assert picked
    result.assert_outcomes(passed=len(picked), deselected=len(cases) - len(picked))


def test_a_name_no_plugin_registers_is_one_clear_failure(pytester):
    result = run_kit(
        pytester,
        """
        from tessera.testing.pytest_plugin import backend_conformance
        test_mine = backend_conformance("no-such-backend")
        """,
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*no loaded plugin registers the backend 'no-such-backend' (installed: numpy, torch;*"]
    )


def test_architecture_parity_uses_the_reference(pytester):
    result = run_kit(
        pytester,
        """
        import numpy as np
        from tessera.files.load import load_model
        from tessera.testing.arch import ArchitectureSubject
        from tessera.testing.pytest_plugin import architecture_conformance, default_runtime

        def torch_logits(path, tokens, shift=0.0):
            # tessera on its torch backend in f32: an independent set of kernels
            from tessera.engine.batch import Batch
            from tessera.engine.context import Context, ContextParams
            model = load_model(path, default_runtime(), "torch", dtype="f32")
            ctx = Context(model, ContextParams(n_ctx=32))
            return ctx.decode(Batch.for_sequence(tokens, logits="all")) + shift

        test_same = architecture_conformance("llama", reference=torch_logits)
        test_shifted = architecture_conformance(
            "llama", reference=lambda p, t: torch_logits(p, t, shift=0.05), n_layer=1
        )
        """,
        "-k",
        "parity",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*logits differ from the reference: relative error*"])


def _broken_q8(**changes) -> QuantType:
    from tessera.plugins.quant.q8_0 import Q8_0

    fields = {
        "name": "BROKEN",
        "ggml_type": 9100,
        "block_size": Q8_0.block_size,
        "type_size": Q8_0.type_size,
        "quantize": Q8_0.quantize,
        "dequantize": Q8_0.dequantize,
        **changes,
    }
    return QuantType(**fields)


class _OneType:
    """A runtime stand-in whose only quant type is ``qtype`` (for the gguf-file check)."""

    def __init__(self, qtype: QuantType) -> None:
        self.qtype = qtype

    def quant_type(self, ggml_type: int) -> QuantType:
        return self.qtype


def failures(qtype: QuantType, **kwargs) -> dict[str, str]:
    found = {}
    for check in quant_checks(qtype, _OneType(qtype), **kwargs):
        try:
            check.run()
        except AssertionError as exc:
            found[check.id.removeprefix(f"{qtype.name}-")] = str(exc)
    return found


def test_quant_checks_pass_a_correct_type():
    q8 = gguf.GGMLQuantizationType.Q8_0
    assert (
        failures(
            _broken_q8(),
            reference_quantize=lambda x: gguf.quants.quantize(x, q8),
            reference_dequantize=lambda b: gguf.quants.dequantize(b, q8),
        )
        == {}
    )


def test_quant_checks_name_each_broken_fact():
    q8 = gguf.GGMLQuantizationType.Q8_0
    wrong_size = failures(_broken_q8(type_size=33))
    assert "layout" not in wrong_size and "expected" in wrong_size["shapes"]

    def noisy(b):
        from tessera.plugins.quant.q8_0 import Q8_0

        return Q8_0.dequantize(b) * np.float32(1.05)

    lossy = failures(
        _broken_q8(dequantize=noisy), reference_dequantize=lambda b: gguf.quants.dequantize(b, q8)
    )
    assert set(lossy) == {"round-trip", "reference-dequantize"}
    assert "exceeds the budget" in lossy["round-trip"]
    assert "bytes differ from the reference" in lossy["reference-dequantize"]

    def nan_on_zero(b):
        from tessera.plugins.quant.q8_0 import Q8_0

        values = Q8_0.dequantize(b)
        peak = np.abs(values).max(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore"):
            return values * (peak / peak)  # 0/0 on an all-zero row

    assert "zeros" in failures(_broken_q8(dequantize=nan_on_zero))


def test_quant_checks_of_a_read_only_type_decode_stored_bytes():
    from tessera.errors import TesseraError
    from tessera.plugins.quant.q8_0 import Q8_0

    q8 = gguf.GGMLQuantizationType.Q8_0

    def refuse(x):
        raise TesseraError("BROKEN needs an importance matrix")

    def noisy(b):
        return Q8_0.dequantize(b) * np.float32(1.05)

    reference = {"reference_dequantize": lambda b: gguf.quants.dequantize(b, q8)}
    read_only = _broken_q8(quantize=refuse, read_only=True)
    ids = {c.id.removeprefix("BROKEN-") for c in quant_checks(read_only, None, **reference)}
    assert ids == {"layout", "shapes", "zeros", "refuses-quantize", "gguf-file"} | {
        "reference-dequantize"
    }
    assert failures(read_only, **reference) == {}
    stored = Q8_0.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
    assert failures(read_only, sample_bytes=stored, **reference) == {}
    broken = failures(_broken_q8(dequantize=noisy, read_only=True), **reference)
    assert set(broken) == {"refuses-quantize", "reference-dequantize"}
    assert "must raise TesseraError" in broken["refuses-quantize"]

    def crash(x):
        raise NotImplementedError  # not a message a user can act on

    assert set(failures(_broken_q8(quantize=crash, read_only=True))) == {"refuses-quantize"}


def test_backend_cases_leave_out_read_only_types():
    from tessera.testing.conformance.kit import conformance_cases

    class _Types:
        def quant_types(self):
            types = dict(default_runtime().quant_types())
            types[9101] = _broken_q8(name="RO", ggml_type=9101, read_only=True)
            return types

    covered = {c.probe.get("quant_type") for c in conformance_cases(_Types())}
    assert "Q8_0" in covered and "RO" not in covered


def test_quant_check_finds_a_type_id_taken_by_another_plugin():
    rt = Runtime(only=["quant-float", "quant-q8_0"])
    clash = _broken_q8(ggml_type=rt.quant_type_by_name("Q8_0").ggml_type)
    found = {c.id: c for c in quant_checks(clash, rt)}
    with pytest.raises(AssertionError, match="resolves to Q8_0, not BROKEN"):
        found["BROKEN-gguf-file"].run()

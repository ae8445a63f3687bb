"""tessera's pytest plugin: run tessera's conformance kits on your own plugin in a few lines.

Installed with tessera (entry point ``pytest11``: ``tessera``), so any test session in an
environment with tessera has its fixtures. In a plugin's test module::

    from tessera.testing.pytest_plugin import (
        architecture_conformance, backend_conformance, quant_type_conformance,
    )

    test_my_backend = backend_conformance("mybackend")           # every op vs numpy
    test_my_quant = quant_type_conformance("MY_Q8", max_error=0.01)
    test_my_arch = architecture_conformance("myarch")              # make, load, run

Each call returns a test function parametrized over the kit's checks, with stable ids
(``pytest -k rope`` runs one family) and the ``tessera_conformance`` marker. A backend
case the backend's ``supports()`` declines is skipped as "not supported". A name that no
loaded plugin registered gives one failing test that lists what is installed and which
plugins failed to load, instead of an empty run.

Fixtures: ``tessera_runtime`` (the session's :class:`~tessera.plugin_manager.Runtime`, honouring
``TESSERA_PLUGINS`` / ``TESSERA_DISABLE_PLUGINS`` / ``TESSERA_STRICT_PLUGINS``),
``tessera_reference_backend`` (the ``numpy`` reference) and ``tessera_make_gguf`` (writes
random-weight model files into the test's ``tmp_path``).

Kits for speculative decoders and communicators join this module, as ``*_conformance``
functions of the same shape, when tessera has hook specs for those plugin kinds.

The module stays light: it imports the kits only when a helper is called or a fixture used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

MARKER = "tessera_conformance"

_RUNTIME: Any = None
_BACKENDS: dict[tuple[int, str, str | None, str | None], Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a check from tessera's conformance kits (tessera.testing)"
    )


def default_runtime() -> Any:
    """The runtime shared by the helpers and the ``tessera_runtime`` fixture (made once)."""
    global _RUNTIME
    if _RUNTIME is None:
        from tessera.plugin_manager import Runtime

        _RUNTIME = Runtime()
    return _RUNTIME


@pytest.fixture(scope="session")
def tessera_runtime() -> Any:
    """The session's plugin runtime: every installed tessera plugin, loaded once."""
    return default_runtime()


@pytest.fixture(scope="session")
def tessera_reference_backend(tessera_runtime: Any) -> Any:
    """The ``numpy`` reference backend that conformance checks compare against."""
    from tessera.testing.conformance.kit import reference_backend

    return reference_backend(tessera_runtime)


@pytest.fixture
def tessera_make_gguf(tessera_runtime: Any, tmp_path: Any) -> Callable[..., Any]:
    """``make(arch="llama", **kw)``: a random-weight GGUF in ``tmp_path`` (see make_gguf)."""
    from tessera.testing.models import make_gguf

    def make(arch: str = "llama", **kwargs: Any) -> Any:
        name = f"{arch}-{kwargs.get('qtype', 'f32')}-{len(list(tmp_path.iterdir()))}.gguf"
        return make_gguf(tmp_path / name, arch, runtime=tessera_runtime, **kwargs)

    return make


def _not_registered(kind: str, name: str, known: Any, runtime: Any) -> str:
    installed = ", ".join(sorted(str(k) for k in known)) or "none"
    failed = "; ".join(f"{f.name}: {f.error}" for f in runtime.failures) or "none"
    return (
        f"no loaded plugin registers the {kind} '{name}' (installed: {installed}; plugins that "
        f"failed to load: {failed}). Is the package installed, its entry point in the "
        "'tessera' group, and the plugin not disabled by TESSERA_PLUGINS/TESSERA_DISABLE_PLUGINS?"
    )


def _missing_test(kind: str, name: str, known: Any, runtime: Any) -> Callable[[], None]:
    message = _not_registered(kind, name, known, runtime)

    @pytest.mark.tessera_conformance
    def test_plugin_is_registered() -> None:
        pytest.fail(message, pytrace=False)

    return test_plugin_is_registered


def _check_test(checks: list[Any]) -> Callable[[Any], None]:
    @pytest.mark.tessera_conformance
    @pytest.mark.parametrize("check", checks, ids=[c.id for c in checks])
    def test_conformance(check: Any) -> None:
        check.run()

    return test_conformance


def _backend(runtime: Any, name: str, device: str | None, dtype: str | None) -> Any:
    key = (id(runtime), name, device, dtype)
    if key not in _BACKENDS:
        backend = runtime.create_backend(name, device, dtype)
        runtime.equip(backend)
        _BACKENDS[key] = backend
    return _BACKENDS[key]


def backend_conformance(
    name: str, *, device: str | None = None, dtype: str | None = None, runtime: Any = None
) -> Callable[..., None]:
    """A test running every op case (:mod:`tessera.testing.conformance.kit`) on backend ``name``.

    Each case compares the backend with the numpy reference within the op's error budget
    for the backend's dtype, for every quant type the runtime has. ``device`` and
    ``dtype`` go to the backend's ``create``; call once per setting you support.
    """
    runtime = runtime or default_runtime()
    if name not in runtime.backends():
        return _missing_test("backend", name, runtime.backends(), runtime)
    from tessera.testing.conformance.kit import check_case, conformance_cases

    cases = conformance_cases(runtime)

    @pytest.mark.tessera_conformance
    @pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])
    def test_backend_conformance(case: Any) -> None:
        check_case(_backend(runtime, name, device, dtype), case, runtime)

    return test_backend_conformance


def quant_type_conformance(
    name: str,
    *,
    max_error: float | None = None,
    reference_quantize: Callable[[Any], Any] | None = None,
    reference_dequantize: Callable[[Any], Any] | None = None,
    row_scales: tuple[float, ...] | None = None,
    sample_bytes: Any = None,
    runtime: Any = None,
) -> Callable[..., None]:
    """A test of quant type ``name``: layout, shapes, zeros, round trip, GGUF file and,
    when given, bit-exactness with reference functions of the same signature as the
    type's ``quantize`` / ``dequantize`` (see :mod:`tessera.testing.quant`).
    ``max_error`` bounds the relative RMS round-trip error, measured on rows of normal
    values with the standard deviations ``row_scales`` (default 1e-3 to 1e2; a type
    without block scales gives the range it represents). A ``read_only`` type is checked
    on stored bytes instead (``sample_bytes``, default random ones)."""
    runtime = runtime or default_runtime()
    by_name = {q.name: q for q in runtime.quant_types().values()}
    if name not in by_name:
        return _missing_test("quant type", name, by_name, runtime)
    from tessera.testing.quant import quant_checks

    return _check_test(
        quant_checks(
            by_name[name],
            runtime,
            max_error=max_error,
            reference_quantize=reference_quantize,
            reference_dequantize=reference_dequantize,
            sample_bytes=sample_bytes,
            **({} if row_scales is None else {"row_scales": tuple(row_scales)}),
        )
    )


def architecture_conformance(
    name: str,
    *,
    backend: str = "numpy",
    dtype: str | None = None,
    reference: Callable[[Any, Any], Any] | None = None,
    tolerance: float | None = None,
    runtime: Any = None,
    **dims: Any,
) -> Callable[..., None]:
    """A test of architecture ``name`` (a GGUF ``general.architecture`` value): a model
    made from its ``example_config`` is written, loaded on ``backend`` and run; with
    ``reference(path, tokens) -> logits``, its logits are compared
    (see :mod:`tessera.testing.arch`). ``dims`` go to ``make_gguf``."""
    runtime = runtime or default_runtime()
    if name not in runtime.architectures():
        return _missing_test("architecture", name, runtime.architectures(), runtime)
    from tessera.testing.arch import architecture_checks

    return _check_test(
        architecture_checks(
            runtime,
            name,
            backend=backend,
            dtype=dtype,
            reference=reference,
            tolerance=tolerance,
            **dims,
        )
    )

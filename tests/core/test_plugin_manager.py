"""Plugin discovery, fault isolation, switches and catalogue conflicts."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tessera import PLUGIN_API_VERSION
from tessera.errors import PluginError, UnknownArchitectureError
from tessera.plugin_manager import Runtime

DUMMY_MODULE = textwrap.dedent(
    """
    import numpy as np
    from tessera.contract.commands import Command
    from tessera.hookspecs import hookimpl
    from tessera.contract.quant import QuantType

    TESSERA_PLUGIN_API = 2

    def _quantize(x):
        return np.round(x).astype(np.int8).view(np.uint8)

    def _dequantize(b):
        return b.view(np.int8).astype(np.float32)

    @hookimpl
    def tessera_register_quant_types(register):
        register(QuantType("DUMMY_I8", 9001, 1, 1, _quantize, _dequantize))

    @hookimpl
    def tessera_register_commands(register):
        register(Command("dummy-hello", "say hello", lambda p: None, lambda a, r: 7))
    """
)


def _install_distribution(
    root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]
) -> None:
    """Lay out an installed distribution (a .dist-info folder) on sys.path, as pip would."""
    info = root / f"{dist}-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[tessera]\n{lines}\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("tessera_test_")]:
        del sys.modules[name]


def test_builtin_plugins_are_found_through_entry_points():
    rt = Runtime()
    names = {p.name for p in rt.plugins}
    assert {"backend-numpy", "arch-llama", "cmd-run"} <= names
    assert {"llama", "qwen2", "qwen3"} <= set(rt.architectures())
    assert "numpy" in rt.backends()
    assert "run" in rt.commands()
    assert rt.hooks_of("arch-llama") == ["tessera_register_architectures"]


def test_third_party_distribution_is_discovered_used_and_can_be_disabled(site, monkeypatch):
    _install_distribution(
        site,
        "tessera_test_dummy",
        {"dummy": "tessera_test_dummy"},
        {"tessera_test_dummy": DUMMY_MODULE},
    )
    rt = Runtime()
    record = next(p for p in rt.plugins if p.name == "dummy")
    assert (record.distribution, record.version) == ("tessera_test_dummy", "1.2.3")
    qtype = rt.quant_type(9001)
    assert qtype.name == "DUMMY_I8"
    assert qtype.dequantize(qtype.quantize(__import__("numpy").array([3.2, -4.7]))).tolist() == [
        3.0,
        -5.0,
    ]
    assert rt.commands()["dummy-hello"].run(None, rt) == 7

    assert "dummy" not in {p.name for p in Runtime(disabled=["dummy"]).plugins}
    monkeypatch.setenv("TESSERA_DISABLE_PLUGINS", "cmd-run, dummy")
    rt = Runtime()
    assert "dummy-hello" not in rt.commands() and "run" not in rt.commands()
    assert "llama" in rt.architectures()


def test_allowlist_loads_only_named_plugins(monkeypatch):
    monkeypatch.setenv("TESSERA_PLUGINS", "backend-numpy")
    rt = Runtime()
    assert [p.name for p in rt.plugins] == ["backend-numpy"]
    with pytest.raises(UnknownArchitectureError, match="no architecture plugin is loaded"):
        rt.architecture("llama")


def test_broken_plugins_are_reported_and_skipped(site):
    _install_distribution(
        site,
        "tessera_test_broken",
        {
            "broken-import": "tessera_test_missing_module",
            "old-api": "tessera_test_old",
            "bad-register": "tessera_test_badreg",
        },
        {
            "tessera_test_old": "TESSERA_PLUGIN_API = 0\n",
            "tessera_test_badreg": textwrap.dedent(
                """
                from tessera.hookspecs import hookimpl
                TESSERA_PLUGIN_API = 2
                @hookimpl
                def tessera_register_architectures(register):
                    raise RuntimeError("boom")
                """
            ),
        },
    )
    rt = Runtime(strict=False)
    assert "llama" in rt.architectures()  # the others keep working
    failures = {f.name: f.error for f in rt.failures}
    assert "ModuleNotFoundError" in failures["broken-import"]
    assert "TESSERA_PLUGIN_API=0" in failures["old-api"]
    assert "RuntimeError: boom" in failures["bad-register"]


def test_strict_mode_raises_on_a_broken_plugin(site, monkeypatch):
    _install_distribution(site, "tessera_test_broken2", {"broken": "tessera_test_nothing_here"}, {})
    monkeypatch.setenv("TESSERA_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="plugin 'broken' failed to load: ModuleNotFoundError"):
        Runtime(only=["arch-llama", "broken"])


def test_second_registration_of_a_name_is_a_conflict(site):
    _install_distribution(
        site,
        "tessera_test_dupe",
        {"zz-dupe-arch": "tessera_test_dupe"},
        {
            "tessera_test_dupe": textwrap.dedent(
                """
                from tessera.hookspecs import hookimpl
                from tessera.models.llama.arch import LlamaArchitecture
                TESSERA_PLUGIN_API = 2
                class Other(LlamaArchitecture):
                    pass
                @hookimpl
                def tessera_register_architectures(register):
                    register(Other())
                """
            )
        },
    )
    rt = Runtime()
    assert type(rt.architecture("llama")).__name__ == "LlamaArchitecture"
    assert any("zz-dupe-arch" in c and "'llama'" in c for c in rt.conflicts)


def test_trace_env_var_prints_hook_calls(monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_TRACE_HOOKS", "1")
    rt = Runtime(only=["arch-llama"])
    rt.pm.hook.tessera_register_architectures(register=lambda a: None)
    assert "tessera_register_architectures" in capsys.readouterr().err


class _CountingDistribution:
    """A distribution whose METADATA is counted each time it is parsed."""

    def __init__(self) -> None:
        self.parses = 0

    @property
    def metadata(self) -> dict[str, str]:
        self.parses += 1
        return {"Name": "tessera_test_pair", "Version": "0.4.2"}


class _EntryPoint:
    def __init__(self, name: str, dist: _CountingDistribution) -> None:
        self.name, self.dist = name, dist

    def load(self):
        """A plugin module that registers no hook."""
        module = type(sys)(f"tessera_test_{self.name}")
        module.TESSERA_PLUGIN_API = PLUGIN_API_VERSION
        return module


def test_plugins_of_one_distribution_read_its_metadata_once():
    dist = _CountingDistribution()
    rt = Runtime(entry_points=[_EntryPoint("first", dist), _EntryPoint("second", dist)])
    assert [(r.name, r.distribution, r.version) for r in rt.plugins] == [
        ("first", "tessera_test_pair", "0.4.2"),
        ("second", "tessera_test_pair", "0.4.2"),
    ]
    assert dist.parses == 1

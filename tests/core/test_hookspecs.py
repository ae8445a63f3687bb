"""The hook-spec module is the extension author's reference: every hook is typed,
documented in its docstring and in docs/extending.md, and implemented by some plugin."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from tessera import hookspecs
from tessera.plugin_manager import Runtime

HOOKS = sorted(
    name
    for name, fn in vars(hookspecs).items()
    if name.startswith("tessera_") and callable(fn) and hasattr(fn, "tessera_spec")
)
EXTENDING = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text(
    encoding="utf-8"
)


def test_hooks_are_found():
    assert "tessera_register_backends" in HOOKS and "tessera_register_routes" in HOOKS


@pytest.mark.parametrize("name", HOOKS)
def test_each_hook_has_a_typed_signature_and_a_docstring(name):
    fn = getattr(hookspecs, name)
    sig = inspect.signature(fn)
    assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())
    doc = inspect.getdoc(fn) or ""
    assert len(doc.split()) >= 20, f"{name} needs a docstring saying when and how it is called"


@pytest.mark.parametrize("name", HOOKS)
def test_each_hook_is_in_the_extension_guide(name):
    assert f"`{name}(" in EXTENDING, f"docs/extending.md does not document {name}"


@pytest.mark.parametrize("name", HOOKS)
def test_each_hook_has_a_built_in_implementation(name):
    runtime = Runtime()
    impls = getattr(runtime.pm.hook, name).get_hookimpls()
    assert impls, f"no installed plugin implements {name}"

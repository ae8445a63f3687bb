"""The layering contracts of pyproject.toml's [tool.importlinter], checked by import-linter.

tessera's folders are mapped onto one import package (core/ is ``tessera``, backends/ is
``tessera.backends`` ...), which import-linter cannot follow on disk: it walks the folder
of ``tessera`` only. So the test lays the sources out as one package tree in a temporary
folder (the .py files only) and runs ``lint-imports`` there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"core": "tessera", "backends": "tessera/backends", "models": "tessera/models"}
FOLDERS["plugins"] = "tessera/plugins"


def _package_tree(dest: Path) -> Path:
    for folder, package in FOLDERS.items():
        for src in (ROOT / folder).rglob("*.py"):
            target = dest / package / src.relative_to(ROOT / folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
    shutil.copyfile(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(lint), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_layering_contracts_hold(tmp_path):
    result = _lint_imports(_package_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_broken_layer_is_caught(tmp_path):
    """The check can fail: a core module that imports a plugin breaks the first contract."""
    tree = _package_tree(tmp_path)
    errors = tree / "tessera" / "errors.py"
    errors.write_text(errors.read_text() + "\nimport tessera.plugins.moe_cache  # noqa\n")
    result = _lint_imports(tree)
    assert result.returncode != 0
    assert "the core imports no backend, model or plugin BROKEN" in result.stdout
    assert "tessera.errors -> tessera.plugins.moe_cache" in result.stdout

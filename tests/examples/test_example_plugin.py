"""The example third-party package, installed as a user would: discovered, listed, used,
fallen back from, disabled, and passing tessera's conformance kits with its own tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.contract.backend import CORE_OPS
from tessera.testing import make_gguf

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tessera-example-backend"
SWITCHES = ("TESSERA_PLUGINS", "TESSERA_DISABLE_PLUGINS", "TESSERA_DISABLE_KERNELS")
SOURCE_JUNK = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example package pip-installed into a folder of its own (the venv is untouched)."""
    root = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE, root / "src", ignore=SOURCE_JUNK)  # builds write next to it
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(root / "site"),
            str(root / "src"),
        ],
        check=True,
        capture_output=True,
    )
    return root


def env_with(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    return {**env, "PYTHONPATH": str(site / "site"), "TESSERA_STRICT_PLUGINS": "1", **extra}


def tessera(site: Path, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tessera", *argv],
        env=env_with(site, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def models(site, tmp_path_factory):
    """A llama file (normal RoPE, GQA), a qwen2 file with full MHA, and that qwen2 in EX_I8."""
    folder = tmp_path_factory.mktemp("models")
    llama = make_gguf(folder / "llama-gqa.gguf", "llama")
    qwen2 = make_gguf(folder / "qwen2-mha.gguf", "qwen2", n_head_kv=4)
    ex_i8 = folder / "qwen2-mha-ex_i8.gguf"
    script = (
        "import sys; from tessera.testing import make_gguf; "
        "make_gguf(sys.argv[1], 'qwen2', n_head_kv=4, qtype='EX_I8')"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(ex_i8)], env=env_with(site), check=True, timeout=120
    )
    return {"llama": llama, "qwen2": qwen2, "ex_i8": ex_i8}


def test_installed_package_is_discovered_and_listed(site):
    done = tessera(site, "--disable-plugins", "backend-torch", "plugins", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins["example-backend"] == {
        "name": "example-backend",
        "module": "tessera_example_backend.backend",
        "distribution": "tessera-example-backend",
        "version": "0.1.0",
        "hooks": ["tessera_register_backends", "tessera_register_weight_kernels"],
    }
    assert plugins["example-quant"]["hooks"] == ["tessera_register_quant_types"]
    assert report["failures"] == [] and report["conflicts"] == []
    assert {"name": "EX_I8", "ggml_type": 8100, "block_size": 32, "type_size": 36} in report[
        "quant_types"
    ]
    example = next(b for b in report["backends"] if b["name"] == "example")
    assert example["usable"] and example["ops"] == list(CORE_OPS)
    assert example["kernels"][0]["quant_type"] == "EX_I8"
    assert example["kernels"][0]["state"] == "active"

    text = tessera(site, "plugins", "--no-probe").stdout
    assert (
        "example-backend (tessera_example_backend.backend; tessera-example-backend 0.1.0)" in text
    )
    assert "example: example plugin" in text


def test_run_uses_the_example_backend_and_keeps_its_type_quantized(site, models):
    args = ["run", "-m", str(models["ex_i8"]), "-p", "The for statement", "-n", "6", "--temp", "0"]
    on_example = tessera(site, "-v", *args, "--backend", "example")
    assert on_example.returncode == 0, on_example.stderr
    assert "on example/f32" in on_example.stderr
    on_numpy = tessera(site, *args, "--backend", "numpy")  # dequantizes EX_I8 instead
    assert on_numpy.returncode == 0, on_numpy.stderr
    assert on_example.stdout == on_numpy.stdout  # greedy: the same tokens either way


def test_auto_selection_falls_back_when_the_example_lacks_an_op(site, models):
    # torch (first in preference) is switched off, so "example" is tried before "numpy".
    base = ["-v", "--disable-plugins", "backend-torch", "run", "-p", "hi", "-n", "2"]
    chosen = tessera(site, *base, "-m", str(models["qwen2"]))
    assert chosen.returncode == 0, chosen.stderr
    assert "on example/f32" in chosen.stderr
    fallback = tessera(site, *base, "-m", str(models["llama"]))
    assert fallback.returncode == 0, fallback.stderr
    assert re.search(
        r"backend skipped: example: does not support rope\(.*neox=False", fallback.stderr
    )
    assert "on numpy/f32" in fallback.stderr


def test_naming_the_example_for_a_model_it_cannot_run_is_one_clear_error(site, models):
    done = tessera(site, "run", "--backend", "example", "-m", str(models["llama"]), "-p", "hi")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: backend 'example' does not support rope(")
    assert "attention(n_head=4, n_head_kv=2" in last and "--backend" in last


def test_disabling_the_plugins(site, models):
    done = tessera(site, "--disable-plugins", "example-backend", "plugins", "--json", "--no-probe")
    report = json.loads(done.stdout)
    assert "example-backend" not in {p["name"] for p in report["plugins"]}
    assert "example" not in {b["name"] for b in report["backends"]}
    assert "EX_I8" in {q["name"] for q in report["quant_types"]}

    args = ["run", "-m", str(models["ex_i8"]), "-p", "hi", "-n", "2", "--backend", "numpy"]
    done = tessera(site, *args, TESSERA_DISABLE_PLUGINS="example-quant")
    assert done.returncode == 1
    assert "unknown tensor type GGML type 8100" in done.stderr.strip().splitlines()[-1]


def test_example_package_passes_the_conformance_kits(site):
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=site / "src",
        env=env_with(site),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and "error" not in summary
    assert int(re.search(r"(\d+) passed", summary).group(1)) >= 60

"""The CLI: bad input gets one clear line and a non-zero exit; version and plugin listing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cli_run import error_line, run_cli

from tessera import __version__
from tessera.cli.main import main
from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf", "llama")


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"tessera {__version__}"


def test_missing_model_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "run", "-m", str(tmp_path / "nope.gguf"), "-p", "hi")
    assert code == 1
    assert "does not exist" in error_line(err) and "-m" in error_line(err)


def test_not_a_gguf_file(capsys, tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just some text, not a model\n")
    code, _, err = run_cli(capsys, "run", "-m", str(path), "-p", "hi")
    assert code == 1
    assert "is not a GGUF file" in error_line(err)
    assert path.read_text() == "just some text, not a model\n"


def test_truncated_gguf_file(capsys, tmp_path, tiny_gguf):
    path = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    before = digest(path)
    code, _, err = run_cli(capsys, "run", "-m", str(path), "-p", "hi")
    assert code == 1
    assert "truncated" in error_line(err)
    assert digest(path) == before


def _rewrite(src, dst, *, arch=None, retype=None):
    """Copy a GGUF, optionally renaming its architecture or giving one tensor another type."""
    gguf = read_gguf(src)
    metadata = dict(gguf.metadata)
    if arch:
        old = metadata["general.architecture"]
        metadata = {k.replace(f"{old}.", f"{arch}.", 1): v for k, v in metadata.items()}
        metadata["general.architecture"] = arch
    tensors = []
    for t in gguf.tensors.values():
        if retype and t.name == retype[0]:
            from gguf import GGML_QUANT_SIZES

            block_size, type_size = GGML_QUANT_SIZES[retype[1]]
            n_bytes = t.n_elements // block_size * type_size
            t = RawTensor(t.name, retype[1], t.shape, np.zeros(n_bytes, dtype=np.uint8))
        tensors.append(t)
    write_gguf(dst, metadata, tensors)
    return dst


def test_unknown_architecture_lists_the_supported_ones(capsys, tmp_path, tiny_gguf):
    path = _rewrite(tiny_gguf, tmp_path / "mamba.gguf", arch="mamba9")
    code, _, err = run_cli(capsys, "run", "-m", str(path), "-p", "hi")
    line = error_line(err)
    assert code == 1
    assert "unknown model architecture 'mamba9'" in line
    assert ", ".join(sorted(Runtime().architectures())) in line  # every installed one


def test_unknown_quant_type_names_the_type_and_tensor(capsys, tmp_path):
    src = make_gguf(tmp_path / "wide.gguf", "llama", n_embd=256, n_ff=256)
    # Q8_1 (GGML type 9) is ggml's intermediate for dot products, never a file's type
    path = _rewrite(src, tmp_path / "q8_1.gguf", retype=("blk.0.ffn_up.weight", 9))
    code, _, err = run_cli(capsys, "run", "-m", str(path), "-p", "hi")
    line = error_line(err)
    assert code == 1
    assert "unknown tensor type Q8_1" in line and "blk.0.ffn_up.weight" in line
    assert "Q4_0" in line  # names the installed ones


def test_prompt_longer_than_the_context(capsys, tiny_gguf):
    prompt = "the quick brown fox jumps over the lazy dog " * 20
    code, _, err = run_cli(capsys, "run", "-m", str(tiny_gguf), "-p", prompt, "-c", "32")
    line = error_line(err)
    assert code == 1
    assert "but the context holds 32" in line and "-c" in line


def test_run_without_prompt(capsys, tiny_gguf):
    code, _, err = run_cli(capsys, "run", "-m", str(tiny_gguf))
    assert code == 1 and "no prompt given" in error_line(err)


def test_run_generates_exactly_n_tokens_greedily(capsys, tiny_gguf):
    args = ["run", "-m", str(tiny_gguf), "-p", "The for statement", "-n", "12", "--temp", "0"]
    code, out1, err = run_cli(capsys, *args, "--backend", "numpy")
    assert code == 0, err
    assert "generation: 12 tokens" in err
    code, out2, _ = run_cli(capsys, *args, "--backend", "numpy")
    assert out1 == out2  # greedy is deterministic


def test_a_generation_cut_by_a_full_context_says_so(capsys, tiny_gguf):
    args = ["run", "-m", str(tiny_gguf), "-p", "The for statement", "--temp", "0", "-c", "16"]
    code, _, err = run_cli(capsys, *args, "-n", "100", "--backend", "numpy")
    assert code == 0, err
    assert "because the context (16 tokens) is full; raise -c" in err
    code, _, err = run_cli(capsys, *args, "-n", "3", "--backend", "numpy")
    assert code == 0 and "is full" not in err


def test_plugins_lists_plugins_ops_and_kernels(capsys):
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    assert "arch-llama (tessera.models.llama.arch" in out
    assert "architectures: " + ", ".join(sorted(Runtime().architectures())) in out
    assert "numpy: device=cpu dtype=f32" in out
    assert "ops: matmul, get_rows" in out
    assert "kernel Q4_0:" in out


def test_disabled_plugins_disappear_from_the_cli(capsys):
    code, out, _ = run_cli(capsys, "--disable-plugins", "arch-llama,cmd-convert", "plugins")
    assert code == 0
    assert "arch-llama" not in out and "convert" not in out.split("commands:")[1].split("\n")[0]


def test_missing_file_leaves_no_output_from_convert(capsys, tmp_path):
    out_path = tmp_path / "out.gguf"
    code, _, err = run_cli(capsys, "convert", str(tmp_path / "missing"), str(out_path))
    assert code == 1 and error_line(err)
    assert not out_path.exists()

"""Loading: backend choice through the capability probe, and what a loaded model holds."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.backend import BackendInfo
from tessera.errors import UnknownBackendError
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.hookspecs import hookimpl
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf
from tessera.testing.terminal import stderr_on_a_terminal


class NoNormalRopeBackend(NumpyBackend):
    """A backend that declines GGML normal-mode RoPE (the layout of GGUF llama files)."""

    name = "fast"

    def supports(self, op):
        if op.name == "rope" and op.get("neox") is False:
            return False
        return super().supports(op)


def _runtime_with_picky_backend() -> Runtime:
    plugin = types.SimpleNamespace(TESSERA_PLUGIN_API=2, __name__="picky")

    @hookimpl
    def tessera_register_backends(register):
        register(BackendInfo("fast", lambda device=None, dtype=None: NoNormalRopeBackend()))

    plugin.tessera_register_backends = tessera_register_backends
    rt = Runtime(only=["backend-numpy", "arch-llama", "quant-float"])
    assert rt.add_plugin(plugin, "picky")
    return rt


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {arch: make_gguf(root / f"{arch}.gguf", arch) for arch in ("llama", "qwen2")}


def test_auto_selection_skips_a_backend_whose_probe_declines_an_op(files):
    rt = _runtime_with_picky_backend()
    assert rt.backend_preference()[0] == "fast"
    assert load_model(files["llama"], rt).backend.name == "numpy"  # normal rope: declined
    assert load_model(files["qwen2"], rt).backend.name == "fast"  # neox rope: accepted


def test_a_named_backend_that_declines_an_op_is_an_error(files):
    rt = _runtime_with_picky_backend()
    with pytest.raises(UnknownBackendError, match=r"'fast' does not support rope\(.*neox=False"):
        load_model(files["llama"], rt, "fast")


def test_loaded_model_has_weights_tokenizer_and_placements(files):
    rt = Runtime()
    model = load_model(files["qwen2"], rt, "numpy")
    assert model.config.arch == "qwen2" and model.config.attn_bias
    assert model.tokenizer is not None and model.n_vocab == model.tokenizer.n_vocab
    assert np.asarray(model.weights["blk.0.attn_q.bias"]).shape == (model.config.n_embd,)
    assert {what for what, _, _ in model.backend.placements} == set(model.weights)


def test_the_model_records_each_tensors_stored_type(files):
    rt = Runtime()
    model = load_model(files["llama"], rt, "numpy")
    stored = read_gguf(files["llama"]).tensors
    assert model.tensor_types == {n: rt.quant_type(t.ggml_type, n).name for n, t in stored.items()}


def test_loading_draws_a_bar_on_a_terminal_and_nothing_elsewhere(files, capsys):
    with stderr_on_a_terminal() as term:
        load_model(files["llama"], Runtime(), "numpy", progress=True)
    assert "loading llama.gguf" in term.text and "tensor" in term.text
    load_model(files["llama"], Runtime(), "numpy", progress=True)
    assert capsys.readouterr().err == ""

"""GET /api/models/{name}: a model's metadata read from its file, checked against the
file read independently (tessera's GGUF reader, safetensors' own loader); unknown or
escaping names are 404; a single-model server answers for its one model."""

from __future__ import annotations

import json
import shutil
import urllib.parse

import numpy as np
import pytest
from conftest import call, server_argv

from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path
from tessera.plugins.server.testing import live_server
from tessera.testing.models import make_hf_dir


def _details(srv, name: str) -> tuple[int, dict]:
    return call(srv.url + "/api/models/" + urllib.parse.quote(name, safe=""))


def test_a_gguf_models_metadata(server, models_dir):
    status, d = _details(server, "beta-q8.gguf")
    assert status == 200, d
    f = read_gguf(models_dir / "beta-q8.gguf")
    assert d["name"] == "beta-q8.gguf" and d["state"] == "on_disk" and d["format"] == "gguf"
    assert d["architecture"] == "llama" and d["n_layer"] == f.metadata["llama.block_count"]
    assert d["parameters"] == sum(int(np.prod(t.shape)) for t in f.tensors.values())
    assert d["n_ctx_train"] == f.metadata["llama.context_length"]
    assert d["n_vocab"] == len(f.metadata["tokenizer.ggml.tokens"])
    by_type = {row["type"]: row for row in d["quant_types"]}
    assert d["quant_types"][0]["type"] == "Q8_0"  # most of the weights first
    assert by_type["Q8_0"]["tensors"] == sum(t.ggml_type == 8 for t in f.tensors.values())
    assert sum(row["elements"] for row in d["quant_types"]) == d["parameters"]
    assert d["chat_template"] == f.metadata["tokenizer.chat_template"]
    assert "tokenizer.chat_template" not in d["metadata"]
    assert d["metadata"]["general.architecture"] == "llama"
    assert d["metadata"]["tokenizer.ggml.tokens"] == f"[{d['n_vocab']} items]"  # summarised


def test_a_loaded_model_gives_its_context_too(server):
    assert call(server.url + "/api/models/load", {"model": "tessera-default.gguf"})[0] == 200
    status, d = _details(server, "tessera-default.gguf")
    assert status == 200 and d["state"] == "loaded" and d["n_ctx"] == 256
    assert d["parameters"] == 5_475_584  # docs/default-model.md


@pytest.mark.parametrize("name", ["nope.gguf", "../alpha.gguf", "..", "/etc/passwd"])
def test_unknown_or_escaping_names_are_404(server, name):
    status, body = _details(server, name)
    assert status == 404  # a name is looked up in the registry, never joined to a path
    if "/" not in name:  # (with one, no route matches at all)
        assert body["error"]["code"] == "model_not_found"


def test_an_hf_folders_metadata(tmp_path, model_sources):
    d = tmp_path / "models"
    d.mkdir()
    shutil.copyfile(model_sources["alpha.gguf"], d / "alpha.gguf")
    folder = make_hf_dir(d / "hf-qwen2", "qwen2", seed=5)
    from safetensors.numpy import load_file

    weights = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    with live_server(server_argv(d)) as srv:
        status, got = _details(srv, "hf-qwen2")
    assert status == 200 and got["format"] == "hf" and got["architecture"] == "qwen2"
    assert got["parameters"] == sum(w.size for w in weights.values())
    assert got["n_layer"] == config["num_hidden_layers"] and got["n_ctx_train"] == 512
    assert [row["type"] for row in got["quant_types"]] == ["F32"]
    assert got["chat_template"] == template
    assert got["metadata"]["model_type"] == "qwen2"


def test_a_single_model_server_answers_for_its_model():
    with live_server(["--backend", "numpy", "-m", str(default_model_path())]) as srv:
        name = call(srv.url + "/api/models")[1]["models"][0]["name"]
        status, d = _details(srv, name)
        assert status == 200 and d["state"] == "loaded" and d["architecture"] == "llama"
        assert _details(srv, "other.gguf")[0] == 404

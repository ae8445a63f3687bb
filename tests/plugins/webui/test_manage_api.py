"""The Models Manager API: every action and its errors."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request

import pytest
from conftest import MODELS, call, rows, server_argv

from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path
from tessera.plugins.server.model_files import FLAGS_FILE
from tessera.plugins.server.testing import live_server


@pytest.fixture
def fresh_dir(tmp_path, model_sources):
    d = tmp_path / "models"
    d.mkdir()
    for name, path in model_sources.items():
        shutil.copyfile(path, d / name)
    return d


@pytest.fixture
def fresh_server(fresh_dir):
    with live_server(server_argv(fresh_dir)) as srv:
        yield srv


def test_list_gives_each_models_file_facts(server, models_dir):
    listed = rows(server)
    assert set(listed) == set(MODELS) | {"tessera-default.gguf"}
    for name in MODELS:
        m, meta = listed[name], read_gguf(models_dir / name).metadata
        assert m["size"] == os.path.getsize(models_dir / name)
        assert m["arch"] == "llama"
        assert m["n_ctx_train"] == meta["llama.context_length"]
        assert m["deletable"] is True and m["hidden"] is False and m["favourite"] is False
    assert listed["alpha.gguf"]["quant"] == "F32"
    assert listed["beta-q8.gguf"]["quant"] == "Q8_0"
    assert listed["tessera-default.gguf"]["quant"] == "F16"
    assert listed["tessera-default.gguf"]["deletable"] is False  # an -m file outside the dir


def test_load_and_unload(server):
    status, m = call(server.url + "/api/models/load", {"model": "gamma.gguf"})
    assert status == 200 and m["state"] == "loaded" and m["n_ctx"] == 256
    assert "gamma.gguf" in [s.name for s in server.state.pool.served()]
    status, m = call(server.url + "/api/models/unload", {"model": "gamma.gguf"})
    assert status == 200 and m["state"] == "on_disk" and m["n_ctx"] is None
    assert "gamma.gguf" not in [s.name for s in server.state.pool.served()]


@pytest.mark.parametrize("action", ["load", "unload", "delete", "hide", "favourite"])
def test_actions_on_unknown_or_escaping_names_are_404(server, action, models_dir):
    for name in ["nope.gguf", "../alpha.gguf", str(models_dir / "alpha.gguf"), "/etc/passwd"]:
        status, body = call(server.url + f"/api/models/{action}", {"model": name})
        assert status == 404, (name, body)
        assert "available models" in body["error"]["message"]
    status, body = call(server.url + f"/api/models/{action}", {})
    assert status == 400 and "'model' is required" in body["error"]["message"]
    assert (models_dir / "alpha.gguf").exists()


def test_delete_removes_the_file(fresh_server, fresh_dir):
    status, body = call(fresh_server.url + "/api/models/delete", {"model": "gamma.gguf"})
    assert status == 200 and body == {"deleted": "gamma.gguf"}
    assert not (fresh_dir / "gamma.gguf").exists()
    assert "gamma.gguf" not in rows(fresh_server)
    assert "gamma.gguf" not in [m["id"] for m in call(fresh_server.v1 + "/models")[1]["data"]]


def test_delete_while_loaded_needs_force(fresh_server, fresh_dir):
    assert call(fresh_server.url + "/api/models/load", {"model": "alpha.gguf"})[0] == 200
    status, body = call(fresh_server.url + "/api/models/delete", {"model": "alpha.gguf"})
    assert status == 409 and "force" in body["error"]["message"]
    assert (fresh_dir / "alpha.gguf").exists()
    status, _ = call(
        fresh_server.url + "/api/models/delete", {"model": "alpha.gguf", "force": True}
    )
    assert status == 200
    assert not (fresh_dir / "alpha.gguf").exists()
    assert fresh_server.state.pool.served() == []


def test_delete_refuses_a_link_leading_out_of_the_models_dir(fresh_dir, tmp_path, model_sources):
    outside = tmp_path / "precious.gguf"
    shutil.copyfile(model_sources["alpha.gguf"], outside)
    (fresh_dir / "link.gguf").symlink_to(outside)
    with live_server(server_argv(fresh_dir)) as srv:
        status, body = call(srv.url + "/api/models/delete", {"model": "link.gguf"})
    assert status == 403 and "outside the models directory" in body["error"]["message"]
    assert outside.exists() and (fresh_dir / "link.gguf").is_symlink()


def test_delete_of_an_m_file_outside_the_dir_is_refused(fresh_server):
    status, body = call(fresh_server.url + "/api/models/delete", {"model": "tessera-default.gguf"})
    assert status == 403 and "only files there can be deleted" in body["error"]["message"]
    assert default_model_path().exists()


def _safetensors_of_size(size: int) -> bytes:
    """A valid safetensors file of exactly ``size`` bytes: one BF16 tensor, its header padded
    with spaces (as the format allows) so the total comes out even."""
    n = (size - 8 - 128) // 2  # values of the one tensor; 128 bytes for the header
    meta = {
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}
    }
    header = json.dumps(meta).encode()
    header += b" " * (size - 8 - 2 * n - len(header))
    return len(header).to_bytes(8, "little") + header + b"\0" * (2 * n)


def test_an_hf_folder_is_listed_and_deleted_whole(fresh_dir):
    hf = fresh_dir / "hf-tiny"
    hf.mkdir()
    config = {"model_type": "llama", "max_position_embeddings": 512, "torch_dtype": "bfloat16"}
    (hf / "config.json").write_text(json.dumps(config))
    (hf / "model.safetensors").write_bytes(_safetensors_of_size(1000))
    with live_server(server_argv(fresh_dir)) as srv:
        m = rows(srv)["hf-tiny"]
        assert (m["arch"], m["quant"], m["n_ctx_train"]) == ("llama", "BF16", 512)
        assert m["size"] == 1000 + len(json.dumps(config))
        assert call(srv.url + "/api/models/delete", {"model": "hf-tiny"})[0] == 200
    assert not hf.exists()


def test_a_model_that_fails_to_load_shows_failed_with_the_reason(fresh_dir):
    data = (fresh_dir / "alpha.gguf").read_bytes()
    (fresh_dir / "broken.gguf").write_bytes(data[: len(data) // 2])
    with live_server(server_argv(fresh_dir)) as srv:
        assert "is truncated" in rows(srv)["broken.gguf"]["error"]
        status, body = call(srv.url + "/api/models/load", {"model": "broken.gguf"})
        assert status == 500 and "cannot load model 'broken.gguf'" in body["error"]["message"]
        m = rows(srv)["broken.gguf"]
        assert m["state"] == "failed" and "is truncated" in m["error"]
        assert call(srv.url + "/api/models/load", {"model": "alpha.gguf"})[0] == 200


def test_hide_and_favourite_persist_across_restarts(fresh_dir):
    with live_server(server_argv(fresh_dir)) as srv:
        status, m = call(srv.url + "/api/models/hide", {"model": "beta-q8.gguf"})
        assert status == 200 and m["hidden"] is True
        status, m = call(srv.url + "/api/models/favourite", {"model": "gamma.gguf"})
        assert status == 200 and m["favourite"] is True
        call(srv.url + "/api/models/favourite", {"model": "alpha.gguf", "favourite": True})
        call(srv.url + "/api/models/favourite", {"model": "alpha.gguf", "favourite": False})
    saved = json.loads((fresh_dir / FLAGS_FILE).read_text())
    assert saved == {"hidden": ["beta-q8.gguf"], "favourite": ["gamma.gguf"]}
    assert [p.name for p in fresh_dir.iterdir() if p.name.endswith(".tmp")] == []
    with live_server(server_argv(fresh_dir)) as srv:
        listed = rows(srv)
        assert listed["beta-q8.gguf"]["hidden"] is True
        assert listed["gamma.gguf"]["favourite"] is True
        assert listed["alpha.gguf"]["favourite"] is False
        status, m = call(srv.url + "/api/models/hide", {"model": "beta-q8.gguf", "hidden": False})
        assert m["hidden"] is False
        # a deleted model's flags go with it
        call(srv.url + "/api/models/delete", {"model": "gamma.gguf"})
    assert json.loads((fresh_dir / FLAGS_FILE).read_text()) == {"hidden": [], "favourite": []}


def test_a_bad_flags_file_is_one_clear_error(fresh_dir):
    from tessera.errors import TesseraError

    (fresh_dir / FLAGS_FILE).write_text("{broken")
    with pytest.raises(TesseraError, match="not a valid flags file"):
        with live_server(server_argv(fresh_dir)):
            pass


def test_api_needs_the_key_and_the_page_does_not(fresh_dir):
    with live_server(server_argv(fresh_dir, "--api-key", "sekrit")) as srv:
        status, body = call(srv.url + "/api/models")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        status, body = call(srv.url + "/api/models/load", {"model": "alpha.gguf"}, key="wrong")
        assert status == 401
        assert call(srv.url + "/api/models", key="sekrit")[0] == 200
        with urllib.request.urlopen(srv.url + "/", timeout=30) as r:
            assert r.status == 200 and b"Models" in r.read()
        with urllib.request.urlopen(srv.url + "/ui/models.js", timeout=30) as r:
            assert r.headers["Content-Type"].startswith("text/javascript")


def test_only_the_ui_files_are_served(server):
    for name in ["..%2Fapi.py", "api.py", "index.html.bak"]:
        try:
            urllib.request.urlopen(server.url + "/ui/" + name, timeout=30)
        except urllib.error.HTTPError as e:
            assert e.code == 404
        else:
            raise AssertionError(f"/ui/{name} was served")


def test_single_model_server_lists_its_model_and_refuses_management():
    with live_server(["--backend", "numpy", "-c", "128", "-np", "1"]) as srv:
        status, body = call(srv.url + "/api/models")
        assert status == 200 and body["manageable"] is False
        assert [m["name"] for m in body["models"]] == ["tessera-default.gguf"]
        status, body = call(srv.url + "/api/models/unload", {"model": "tessera-default.gguf"})
        assert status == 400 and "--models-dir" in body["error"]["message"]


def test_models_dir_must_exist(tmp_path):
    from tessera.errors import TesseraError

    with pytest.raises(TesseraError, match="is not a directory"):
        with live_server(["--backend", "numpy", "--models-dir", str(tmp_path / "nope")]):
            pass

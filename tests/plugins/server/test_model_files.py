"""What a models directory holds, read without loading: scanning, header facts, flags."""

from __future__ import annotations

import json
import os

from tessera.plugins.server.model_files import (
    FLAGS_FILE,
    ModelFlags,
    inspect_model,
    scan_models_dir,
)
from tessera.testing.models import make_gguf


def test_scan_finds_gguf_files_and_hf_folders_only(tmp_path):
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / ".a.gguf.part").write_bytes(b"GG")
    (tmp_path / ".hidden.gguf").write_bytes(b"GGUF")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / FLAGS_FILE).write_text("{}")
    assert {n: p.name for n, p in scan_models_dir(tmp_path).items()} == {
        "a.gguf": "a.gguf",
        "hf": "hf",
    }


def test_inspect_reads_the_header(tmp_path):
    path = make_gguf(tmp_path / "m.gguf", qtype="q8_0", n_layer=1)
    info = inspect_model(path)
    assert (info.size, info.arch, info.quant, info.error) == (
        os.path.getsize(path),
        "llama",
        "Q8_0",
        None,
    )
    assert info.n_ctx_train > 0


def test_a_broken_file_is_reported_not_raised(tmp_path):
    path = make_gguf(tmp_path / "m.gguf", n_layer=1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    info = inspect_model(path)
    assert info.size == len(data) // 3 and info.arch == ""
    assert "is truncated" in info.error


def test_flags_round_trip_and_leave_no_temp_files(tmp_path):
    flags = ModelFlags.load(tmp_path)
    flags.set("hidden", "a.gguf", True)
    flags.set("favourite", "b.gguf", True)
    flags.set("favourite", "c.gguf", True)
    flags.set("favourite", "c.gguf", False)
    assert json.loads((tmp_path / FLAGS_FILE).read_text()) == {
        "hidden": ["a.gguf"],
        "favourite": ["b.gguf"],
    }
    again = ModelFlags.load(tmp_path)
    assert (again.hidden, again.favourite) == ({"a.gguf"}, {"b.gguf"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [FLAGS_FILE]


def test_flags_without_a_directory_stay_in_memory():
    flags = ModelFlags.load(None)
    flags.set("hidden", "x", True)
    assert flags.hidden == {"x"} and flags.path is None

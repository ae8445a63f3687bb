"""``tessera embed`` and ``tessera rerank``: inputs from flags, files and stdin; JSON lines
or .npy out, equal to the engine API's answers; bad input gives one line and exit code 1."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from tessera.cli.main import main
from tessera.engine.embed import Embedder
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.bert_models import make_bert_hf_dir
from tessera.testing.commands import registered_command
from tessera.testing.models import make_gguf

RUNTIME = Runtime()
TEXTS = ["the first line", "a second, longer line of text", "third"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("embed") / "bert.gguf", "bert")


@pytest.fixture(scope="module")
def expected(bert):
    emb = Embedder(load_model(bert, RUNTIME, "numpy"))
    return emb.embed([emb.tokenize(t) for t in TEXTS]), emb


def test_both_commands_are_registered():
    assert registered_command("tessera.plugins.cmd.embed", "embed").name == "embed"
    assert registered_command("tessera.plugins.cmd.rerank", "rerank").name == "rerank"


def test_stdin_to_json_lines(bert, expected, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS) + "\n\n"))
    assert main(["embed", "-m", str(bert), "--backend", "numpy"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    np.testing.assert_allclose([r["embedding"] for r in rows], expected[0], atol=1e-6)


def test_file_to_npy_with_mrl_dims(bert, expected, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS), encoding="utf-8")
    out = tmp_path / "out.npy"
    argv = ["embed", "-m", str(bert), "--backend", "numpy", "-f", str(src), "-o", str(out)]
    assert main([*argv, "--embd-dims", "8"]) == 0
    got = np.load(out)
    raw = expected[0][:, :8]
    np.testing.assert_allclose(got, raw / np.linalg.norm(raw, axis=1)[:, None], atol=1e-5)


def test_prompt_with_separator_and_normalize_off(bert, expected, capsys):
    argv = ["embed", "-m", str(bert), "--backend", "numpy", "--embd-normalize", "-1"]
    assert main([*argv, "-p", "|".join(TEXTS), "--embd-separator", "|"]) == 0
    rows = [json.loads(line)["embedding"] for line in capsys.readouterr().out.splitlines()]
    emb = expected[1]
    raw = Embedder(emb.model, normalize=-1).embed([emb.tokenize(t) for t in TEXTS])
    np.testing.assert_allclose(rows, raw, atol=1e-6)


def test_bad_dims_fail_with_one_line_and_write_nothing(bert, tmp_path, capsys):
    out = tmp_path / "out.npy"
    argv = ["embed", "-m", str(bert), "-p", "x", "-o", str(out), "--embd-dims", "1000"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dimensions=1000 is outside 1..64") and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_rerank_without_a_classifier_says_so(bert, capsys):
    assert main(["rerank", "-m", str(bert), "-q", "q", "--document", "d"]) == 1
    assert "no classifier head" in capsys.readouterr().err


def test_rerank_prints_scores_sorted(tmp_path, capsys):
    folder, _ = make_bert_hf_dir(tmp_path / "rank", classifier=True, seed=2)
    docs = ["foxes jump", "bananas are yellow", "the lazy dog sleeps"]
    model = load_model(folder, RUNTIME, "numpy")
    scores = Embedder(model, classifier_activation="sigmoid").rerank("fox", docs)
    argv = ["rerank", "-m", str(folder), "--backend", "numpy", "-q", "fox", "--sort"]
    argv += ["--classifier-activation", "sigmoid", "--top-n", "2"]
    for d in docs:
        argv += ["--document", d]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    best = np.argsort(-scores)[:2]
    assert [r["index"] for r in rows] == best.tolist()
    np.testing.assert_allclose([r["score"] for r in rows], scores[best], atol=1e-6)
    assert rows[0]["document"] == docs[best[0]]


def test_a_decoders_cache_types_are_those_of_ctk_and_ctv(tmp_path, capsys):
    """A causal model embeds through its KV cache: -ctk/-ctv set its storage."""
    llama = make_gguf(tmp_path / "llama.gguf", "llama", seed=4)
    argv = ["embed", "-m", str(llama), "--backend", "torch", "--dtype", "f32", "-p", TEXTS[1]]
    argv += ["--pooling", "mean", "--embd-normalize", "-1"]
    got = {}
    for kv in ("", "f16"):
        assert main([*argv, *(["-ctk", kv, "-ctv", kv] if kv else [])]) == 0
        got[kv] = np.array(json.loads(capsys.readouterr().out)["embedding"])
    emb = Embedder(load_model(llama, RUNTIME, "torch", dtype="f32"), pooling="mean",
                   normalize=-1, kv_types=("f16", "f16"))  # fmt: skip
    np.testing.assert_allclose(got["f16"], emb.embed([emb.tokenize(TEXTS[1])])[0], atol=1e-6)
    assert np.abs(got["f16"] - got[""]).max() > 1e-5  # an f16 cache is not the f32 one

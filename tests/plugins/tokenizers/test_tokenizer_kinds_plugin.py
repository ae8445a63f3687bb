"""The tokenizers plugin registers the t5, rwkv and plamo2 kinds through the hook; without it
their vocabularies are refused with one sentence naming the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tokenizer_vectors import VOCAB_DIR, metadata, tokenizer

from tessera.plugin_manager import Runtime
from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer, TokenizerError

VOCABS = {
    "t5": "mini-nomic-bert-moe.gguf",
    "rwkv": "synthetic-rwkv.gguf",
    "plamo2": "synthetic-plamo2.gguf",
}
_CAPTURE = dict(capture_output=True, text=True, timeout=120)


def test_each_kind_is_registered_by_the_plugin() -> None:
    runtime = default_runtime()
    kinds = runtime.catalogue("tokenizer_kind")
    assert {m: k.name for m, k in kinds.items()} == {
        "t5": "ugm",
        "rwkv": "rwkv",
        "plamo2": "plamo2",
    }
    assert set(runtime.owners("tokenizer_kind").values()) == {"tokenizers"}


@pytest.mark.parametrize("model", list(VOCABS))
def test_without_the_plugin_the_vocabulary_is_refused_naming_it(model: str) -> None:
    meta = metadata(VOCABS[model])
    assert meta["tokenizer.ggml.model"] == model
    without = Runtime(disabled=["tokenizers"])
    for runtime in (without, None):
        with pytest.raises(TokenizerError, match=f"'{model}' is run by the plugin 'tokenizers'"):
            Tokenizer.from_gguf_metadata(meta, runtime)
    assert Tokenizer.from_gguf_metadata(meta, default_runtime()).model == model


def test_tessera_plugins_lists_the_kinds() -> None:
    run = [sys.executable, "-m", "tessera", "plugins"]
    text = subprocess.run([*run, "--no-probe"], capture_output=True, text=True, check=True)
    assert "tokenizer kind ugm (t5): SentencePiece's unigram model" in text.stdout
    report = subprocess.run([*run, "--json", "--no-probe"], capture_output=True, text=True)
    kinds = json.loads(report.stdout)["tokenizer_kinds"]
    assert [(k["name"], k["models"]) for k in kinds] == [
        ("ugm", ["t5"]),
        ("rwkv", ["rwkv"]),
        ("plamo2", ["plamo2"]),
    ]


def test_tessera_tokenize_without_the_plugin_exits_with_one_line_naming_it() -> None:
    path = str(VOCAB_DIR / VOCABS["rwkv"])
    run = [sys.executable, "-m", "tessera"]
    ok = subprocess.run([*run, "tokenize", "-m", path, "hello world", "--ids"], **_CAPTURE)
    assert ok.returncode == 0
    assert json.loads(ok.stdout) == tokenizer(VOCABS["rwkv"]).encode("hello world")
    cmd = [*run, "--disable-plugins", "tokenizers", "tokenize", "-m", path, "hello"]
    refused = subprocess.run(cmd, **_CAPTURE)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "error: tokenizer model 'rwkv' is run by the plugin 'tokenizers', which is not loaded; "
        "enable it (check --disable-plugins, TESSERA_DISABLE_PLUGINS and TESSERA_PLUGINS) or "
        "reinstall tessera"
    ]

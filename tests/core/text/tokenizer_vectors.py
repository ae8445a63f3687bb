"""llama.cpp's tokenizer test data in tests/data/vocab, read the way its tests read it; the
tokenizers are built with the installed plugins' tokenizer kinds (t5, rwkv, plamo2)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from tessera.files.gguf import read_gguf
from tessera.testing.pytest_plugin import default_runtime
from tessera.text.tokenizer import Tokenizer

VOCAB_DIR = Path(__file__).resolve().parents[2] / "data" / "vocab"
SEPARATOR = "\n__ggml_vocab_test__\n"


def read_inp(path: Path) -> list[str]:
    """The strings of an .inp file, split as llama.cpp's test-tokenizer-0 splits them: each
    is followed by the separator, except that the last one may lack it."""
    raw = path.read_bytes().decode("utf-8")  # no newline translation
    texts = raw.split(SEPARATOR)
    return texts[:-1] if texts[-1] == "" else texts


def read_out(path: Path) -> list[list[int]]:
    """One line of space-separated ids per string."""
    return [[int(x) for x in line.split()] for line in path.read_text().splitlines()]


def vocab_files() -> list[str]:
    """Every vocabulary in the folder that has test strings and llama.cpp's answers."""
    return sorted(
        p.name
        for p in VOCAB_DIR.glob("*.gguf")
        if Path(f"{p}.inp").exists() and Path(f"{p}.out").exists()
    )


def vectors(name: str) -> list[tuple[str, list[int]]]:
    texts = read_inp(VOCAB_DIR / f"{name}.inp")
    ids = read_out(VOCAB_DIR / f"{name}.out")
    assert len(texts) == len(ids), name
    return list(zip(texts, ids, strict=True))


@functools.cache
def metadata(name: str) -> dict[str, Any]:
    return dict(read_gguf(VOCAB_DIR / name).metadata)


@functools.cache
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata(name), default_runtime())


@functools.cache
def recorded(name: str) -> dict[str, Any]:
    """One of the llama-cpp-*.json files record_llama_cpp.py wrote."""
    return json.loads((VOCAB_DIR / f"llama-cpp-{name}.json").read_text(encoding="utf-8"))

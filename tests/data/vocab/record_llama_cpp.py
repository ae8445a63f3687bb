"""Records llama.cpp's tokenization of every vocabulary in this folder (see README.md).

Run from the repository root (not in CI; it needs a llama.cpp source tree with a build of
libllama in ``build/bin``):

    .venv/bin/python tests/data/vocab/record_llama_cpp.py LLAMA_CPP_DIR

It copies llama.cpp's test vocabularies under 5 MB (``models/ggml-vocab-*``), builds the mini
and synthetic ones (``make_vocabs.py``), and asks libllama, through ctypes, for: the ids of
every test string of every vocabulary (``.inp`` -> ``.out``, checked against llama.cpp's own
``.out`` where it has one, and, for a mini vocabulary, against its full original); the ids
under every ``tokenizer.ggml.pre`` name llama.cpp accepts (``llama-cpp-pre.json``); and what
it derives on load, plus the ids with BOS/EOS and special-token parsing
(``llama-cpp-load.json``).
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from make_vocabs import HERE, mini, read_inp, standard_texts, synthetic, write_inp

from tessera.files.gguf import read_gguf
from tessera.files.gguf_writer import write_gguf

MAX_BYTES = 5_000_000
ROLES = "bos eos eot sep pad mask fim_pre fim_suf fim_mid fim_pad fim_rep fim_sep".split()
# pre-tokenizers whose BPE runs on raw UTF-8 go on the SentencePiece-style mini vocabulary
RAW_PRE = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"}


class Libllama:
    """The few libllama calls the recording needs."""

    def __init__(self, llama_cpp: Path, work: Path) -> None:
        lib = llama_cpp / "build" / "bin"
        shim = work / "shim.so"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-o", shim, HERE / "llama_cpp_shim.c",
             f"-I{llama_cpp / 'include'}", f"-I{llama_cpp / 'ggml' / 'include'}",
             f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"],
            check=True,
        )  # fmt: skip
        self.c = ctypes.CDLL(str(shim))
        self.c.shim_load_vocab.restype = ctypes.c_void_p
        self.c.shim_load_vocab.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        self.c.llama_tokenize.argtypes = [
            ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
            ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_bool, ctypes.c_bool,
        ]  # fmt: skip
        self.c.llama_token_to_piece.argtypes = [
            ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
            ctypes.c_bool,
        ]  # fmt: skip
        for name in ("get_attr", "is_eog"):
            getattr(self.c, f"llama_vocab_{name}").argtypes = [ctypes.c_void_p, ctypes.c_int32]
        for name in [*ROLES, "n_tokens", "get_add_bos", "get_add_eos", "get_add_sep"]:
            getattr(self.c, f"llama_vocab_{name}").argtypes = [ctypes.c_void_p]
        self.c.llama_model_free.argtypes = [ctypes.c_void_p]

    def load(self, path: Path) -> Vocab:
        model = ctypes.c_void_p()
        vocab = self.c.shim_load_vocab(str(path).encode(), ctypes.byref(model))
        if not vocab:
            raise RuntimeError(f"libllama cannot load {path}")
        return Vocab(self.c, vocab, model)


class Vocab:
    def __init__(self, c: ctypes.CDLL, vocab: int, model: ctypes.c_void_p) -> None:
        self.c, self.v, self.model = c, vocab, model

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list:
        data = text.encode()
        cap = 4 * len(data) + 16
        buf = (ctypes.c_int32 * cap)()
        n = self.c.llama_tokenize(self.v, data, len(data), buf, cap, add_special, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def load_facts(self) -> dict:
        n = self.c.llama_vocab_n_tokens(self.v)
        attrs = [self.c.llama_vocab_get_attr(self.v, i) for i in range(n)]
        return {
            "add_bos": bool(self.c.llama_vocab_get_add_bos(self.v)),
            "add_eos": bool(self.c.llama_vocab_get_add_eos(self.v)),
            "add_sep": bool(self.c.llama_vocab_get_add_sep(self.v)),
            "special": {r: _id(getattr(self.c, f"llama_vocab_{r}")(self.v)) for r in ROLES},
            "eog": [i for i in range(n) if self.c.llama_vocab_is_eog(self.v, i)],
            "attrs": {str(i): a for i, a in enumerate(attrs) if a != 4},  # all but NORMAL
            # token_to_piece with specials rendered, for a thousand tokens across the vocab
            "pieces": {str(i): self.piece(i).hex() for i in range(0, n, max(1, n // 1000))},
        }

    def piece(self, tid: int, size: int = 64) -> bytes:
        buf = ctypes.create_string_buffer(size)
        n = self.c.llama_token_to_piece(self.v, tid, buf, size, 0, True)
        return buf.raw[:n] if n >= 0 else self.piece(tid, -n)

    def close(self) -> None:
        self.c.llama_model_free(self.model)


def _id(tid: int) -> int | None:
    return None if tid < 0 else tid


def write_json(path: Path, data: dict) -> None:
    """JSON with one top-level entry (and one pre-tokenizer or vocabulary) per line."""
    lines = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in data.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def write_out(path: Path, rows: list[list[int]]) -> None:
    path.write_text("".join("".join(f" {i}" for i in row) + "\n" for row in rows))


def read_out(path: Path) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in path.read_text().splitlines()]


def tokenize_all(llama: Libllama, path: Path, texts: list[str]) -> list[list[int]]:
    vocab = llama.load(path)
    try:
        return [vocab.tokenize(t) for t in texts]
    finally:
        vocab.close()


def special_cases(path: Path) -> list[str]:
    """Strings around a few of the vocabulary's special tokens (and BOS/EOS texts)."""
    meta = read_gguf(path).metadata
    tokens, types = meta["tokenizer.ggml.tokens"], meta.get("tokenizer.ggml.token_type") or []
    special = [t for t, k in zip(tokens, types, strict=False) if k in (2, 3, 4) and t][:6]
    special += [t for t in ("<|im_start|>", "<|end|>", "</s>", "<s>", "<dna>") if t in tokens]
    out = ["Hello world", "", " "]
    for t in dict.fromkeys(special):
        out += [f"Hi{t}there", f" {t}  x ", f"{t}{t}\n{t}", f"a {t}"]
    return out


def with_keys(path: Path, work: Path, name: str, **keys: object) -> Path:
    """A copy of the vocabulary at ``path`` with ``keys`` set (``None`` removes a key)."""
    from make_vocabs import _typed

    meta = dict(read_gguf(path).metadata)
    for key, value in keys.items():
        meta.pop(key, None) if value is None else meta.__setitem__(key, value)
    out = work / f"{name}.gguf"
    write_gguf(out, _typed(meta), [])
    return out


def _raw_model(pre: str) -> str:
    # llama.cpp runs the whitespace pre-tokenizer in its own model only
    return "whitespace" if pre == "whitespace" else "gpt2"


def pre_names(llama_cpp: Path) -> list[str]:
    source = (llama_cpp / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    return sorted(set(re.findall(r'tokenizer_pre == "([^"]+)"', source)))


def main(llama_cpp: Path) -> None:
    models = llama_cpp / "models"
    work = Path(tempfile.mkdtemp())
    llama = Libllama(llama_cpp, work)
    texts = standard_texts(models)
    vocabs: list[Path] = []
    for src in sorted(models.glob("ggml-vocab-*.gguf")):
        if src.stat().st_size > MAX_BYTES:
            continue
        dst = HERE / src.name
        shutil.copyfile(src, dst)
        vocabs.append(dst)
        inp = Path(f"{src}.inp")
        if inp.exists():
            shutil.copyfile(inp, f"{dst}.inp")
            shutil.copyfile(f"{src}.out", f"{dst}.out")
            assert tokenize_all(llama, dst, read_inp(inp)) == read_out(Path(f"{src}.out")), dst
        else:  # llama.cpp ships no strings for it: record its answers to the standard ones
            write_inp(Path(f"{dst}.inp"), texts)
            write_out(Path(f"{dst}.out"), tokenize_all(llama, dst, texts))
    for name in ("qwen2", "gemma-4", "nomic-bert-moe"):
        vocabs.append(record_mini(llama, models, name, texts, work))
    for path in synthetic(models, texts):
        write_inp(Path(f"{path}.inp"), texts)
        write_out(Path(f"{path}.out"), tokenize_all(llama, path, texts))
        vocabs.append(path)
    record_pre(llama, llama_cpp, texts, work)
    record_load(llama, vocabs)
    record_variants(llama, texts, work)


def record_mini(llama: Libllama, models: Path, name: str, texts: list[str], work: Path) -> Path:
    """Build mini-NAME.gguf and check llama.cpp tokenizes with it as with the full file."""
    full = models / f"ggml-vocab-{name}.gguf"
    path = mini(models, name, texts)
    full_tokens = read_gguf(full).metadata["tokenizer.ggml.tokens"]
    position = {t: i for i, t in enumerate(read_gguf(path).metadata["tokenizer.ggml.tokens"])}
    variants: list[dict[str, object]] = [{}]
    if name == "qwen2":
        names = [p for p in pre_names(models.parent) if p not in RAW_PRE]
        variants += [{"tokenizer.ggml.pre": p} for p in names]
    elif name == "gemma-4":
        variants += [
            {"tokenizer.ggml.model": _raw_model(p), "tokenizer.ggml.pre": p}
            for p in sorted(RAW_PRE)
        ]
    else:
        variants += VARIANTS["mini-nomic-bert-moe.gguf"]
    for k, keys in enumerate(variants):
        want = tokenize_all(llama, with_keys(full, work, f"full{k}", **keys), texts)
        got = tokenize_all(llama, with_keys(path, work, f"mini{k}", **keys), texts)
        assert [[position[full_tokens[i]] for i in row] for row in want] == got, (name, keys)
    write_inp(Path(f"{path}.inp"), texts)
    write_out(Path(f"{path}.out"), tokenize_all(llama, path, texts))
    return path


def record_pre(llama: Libllama, llama_cpp: Path, texts: list[str], work: Path) -> None:
    cases = {}
    for name in pre_names(llama_cpp):
        base = HERE / ("mini-gemma-4.gguf" if name in RAW_PRE else "mini-qwen2.gguf")
        keys = {"tokenizer.ggml.pre": name}
        if name in RAW_PRE:
            keys["tokenizer.ggml.model"] = _raw_model(name)
        vocab = with_keys(base, work, f"pre-{name}", **keys)
        cases[name] = {"vocab": base.name, "ids": tokenize_all(llama, vocab, texts)}
    write_json(HERE / "llama-cpp-pre.json", {"texts": texts, **cases})


def record_load(llama: Libllama, vocabs: list[Path]) -> None:
    out = {}
    for path in vocabs:
        vocab = llama.load(path)
        try:
            facts = vocab.load_facts()
            facts["cases"] = [
                [text, add, parse, vocab.tokenize(text, add, parse)]
                for text in special_cases(path)
                for add, parse in ((True, False), (True, True), (False, True))
            ]
        finally:
            vocab.close()
        out[path.name] = facts
    write_json(HERE / "llama-cpp-load.json", out)


#: Flag combinations the test files do not have, per vocabulary: llama.cpp's ids for each.
VARIANTS = {
    "mini-nomic-bert-moe.gguf": [
        {"tokenizer.ggml.add_space_prefix": a, "tokenizer.ggml.remove_extra_whitespaces": r}
        for a in (False, True)
        for r in (False, True)
    ],
    "synthetic-whitespace.gguf": [{"tokenizer.ggml.normalizer.lowercase": None}],
    "mini-gemma-4.gguf": [{"tokenizer.ggml.add_bos_token": False}],
}


def record_variants(llama: Libllama, texts: list[str], work: Path) -> None:
    out = {}
    for name, variants in VARIANTS.items():
        out[name] = []
        for k, keys in enumerate(variants):
            path = with_keys(HERE / name, work, f"variant{k}", **keys)
            vocab = llama.load(path)
            try:
                ids = [vocab.tokenize(t, add_special=True) for t in texts]
            finally:
                vocab.close()
            out[name].append({"keys": keys, "ids": ids})
    write_json(HERE / "llama-cpp-variants.json", {"texts": texts, **out})


if __name__ == "__main__":
    main(Path(sys.argv[1]))

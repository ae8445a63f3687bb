"""Makes the llama-like families' test models: for each spec of ``tests/models/llama_like.py``
a random-weight HF folder that transformers writes (``<name>/hf/``) and the GGUF that
llama.cpp's own converter writes from it (``<name>/<name>.gguf``), plus ``<name>/README.md``.

Not run in CI (CI has no llama.cpp); the tests read the committed files. Run::

    pip install --target DEPS sentencepiece     # llama.cpp's converter imports it
    .venv/bin/python tests/data/arch/make_fixtures_llama_like.py LLAMA_CPP DEPS [NAME ...]

with ``LLAMA_CPP`` the llama.cpp source tree (its ``convert_hf_to_gguf.py`` and
``gguf-py``). The converter runs in a child process, unchanged but for one thing: it
recognizes a BPE vocabulary by the hash of its tokens for a test string, and the test
vocabulary is in none of its tables, so where the converter gives up the script answers
``gpt-2``, the test vocabulary's real pre-tokenizer (GPT-2's byte-level regex).
"""

from __future__ import annotations

import platform
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = """# `{name}`: a random-weight {hf_type} checkpoint and llama.cpp's GGUF of it

- `hf/`: written by transformers {transformers} (torch {torch}, float32) from
  `{hf_type}`'s config class, under `torch.manual_seed({seed})`; the spec is `{name}` in
  `tests/models/llama_like.py` (dims, config fields, chat template `{template}`), the
  vocabulary a {vocab}-token byte-level BPE trained on Python's pydoc topics.
- `{name}.gguf`: `convert_hf_to_gguf.py hf --outtype f32` of the llama.cpp sources vendored
  by llama-cpp-python 0.3.36 (with its `gguf-py`), answering `gpt-2` for the test
  vocabulary's unknown pre-tokenizer hash; architecture `{arch}`.

Made by `tests/data/arch/make_fixtures_llama_like.py` (Python {python}); not made in CI.
"""


def convert(llama_cpp: Path, deps: Path, src: Path, out: Path) -> None:
    """Run llama.cpp's converter on ``src`` in this process (the child's job)."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp), str(deps)]
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:  # the test vocabulary: GPT-2's pre-tokenizer
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", "f32", "--outfile", str(out)]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")


def make(name: str, llama_cpp: Path, deps: Path) -> None:
    import torch
    import transformers
    from llama_like import FIXTURES, VOCAB_SIZE, write_tokenizer_config

    from tessera.testing.models import (
        CHATML_TEMPLATE,
        EOT,
        make_hf_dir,
        train_fallback_tokenizer,
        vocab_from_tokenizer_json,
    )

    f = FIXTURES[name]
    vocab = vocab_from_tokenizer_json(train_fallback_tokenizer(VOCAB_SIZE), CHATML_TEMPLATE, EOT)
    shutil.rmtree(f.folder, ignore_errors=True)
    hf = dict(f.hf)
    make_hf_dir(
        f.hf_dir, f.hf_type, seed=f.seed, tie_word_embeddings=f.tied, hf_overrides=hf,
        vocab=vocab, **f.dims,
    )  # fmt: skip
    write_tokenizer_config(f, f.hf_dir, vocab.eos_token)
    cmd = [sys.executable, __file__, "--convert", str(llama_cpp), str(deps), str(f.hf_dir)]
    subprocess.run([*cmd, str(f.gguf)], check=True)
    (f.folder / "README.md").write_text(
        README.format(
            name=name,
            hf_type=f.hf_type,
            arch=f.arch,
            seed=f.seed,
            template=f.template,
            vocab=VOCAB_SIZE,
            transformers=transformers.__version__,
            torch=torch.__version__,
            python=platform.python_version(),
        )
    )


def main(argv: list[str]) -> None:
    if argv[:1] == ["--convert"]:
        convert(*(Path(a) for a in argv[1:5]))
        return
    sys.path[:0] = [str(ROOT / "tests" / "models")]
    from llama_like import FIXTURES

    llama_cpp, deps, *names = argv
    for name in names or FIXTURES:
        make(name, Path(llama_cpp), Path(deps))


if __name__ == "__main__":
    main(sys.argv[1:])

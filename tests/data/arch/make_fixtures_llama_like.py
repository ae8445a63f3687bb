"""Makes the llama-like families' and DeepSeek's test models: for each spec of
``tests/models/llama_like.py`` and ``tests/models/deepseek2_fixtures.py`` a random-weight HF
folder that transformers writes (``<name>/hf/``) and the GGUF that llama.cpp's own converter
writes from it (``<name>/<name>.gguf``), plus ``<name>/README.md``. A spec with MTP blocks
(GLM-4.5) gets them appended to the checkpoint, made with transformers' own decoder layer
class (transformers makes and loads the model without them, as it loads real GLM-4.5
checkpoints).

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

import json
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
  `tests/models/{module}.py` (dims, config fields, chat template `{template}`), the
  vocabulary a {vocab}-token byte-level BPE trained on Python's pydoc topics{extra}.
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


def fixtures() -> dict:
    """Every spec, by name: the llama-like families' and DeepSeek's."""
    import deepseek2_fixtures
    import llama_like

    return llama_like.FIXTURES | deepseek2_fixtures.FIXTURES


def with_special_tokens(tokenizer_json: str, tokens: tuple[str, ...]) -> str:
    """``tokenizer.json`` with ``tokens`` added as special tokens (after the others)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_str(tokenizer_json)
    tok.add_special_tokens([AddedToken(t, special=True) for t in tokens])
    return tok.to_str()


def write_tokenizer_config(f, folder: Path, eos_token: str) -> None:
    """The fixture's ``tokenizer_config.json``: its family's chat template and tokens."""
    from llama_like import TEMPLATE_DIR

    config = {
        "tokenizer_class": f.tokenizer_class,
        "bos_token": eos_token,
        "eos_token": eos_token,
        "pad_token": eos_token,
        "chat_template": (TEMPLATE_DIR / f"{f.template}.jinja").read_text(),
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def append_nextn_blocks(folder: Path, n_nextn: int, seed: int) -> None:
    """Append ``n_nextn`` MTP blocks to the checkpoint as GLM-4.5's are stored: a decoder
    layer of transformers' own class at index ``num_hidden_layers + i`` plus ``eh_proj``,
    ``enorm``, ``hnorm`` and ``shared_head.norm``, random like the rest (N(0, 0.02)
    matrices, norms 1 + N(0, 0.02), biases N(0, 0.02))."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    layer_class = type(model.model.layers[-1])
    tensors = load_file(folder / "model.safetensors")
    torch.manual_seed(seed + 1000)
    e = config.hidden_size
    for i in range(config.num_hidden_layers, config.num_hidden_layers + n_nextn):
        block = layer_class(config, layer_idx=i)
        extra = {
            "eh_proj.weight": torch.empty(e, 2 * e),
            "enorm.weight": torch.ones(e),
            "hnorm.weight": torch.ones(e),
            "shared_head.norm.weight": torch.ones(e),
        }
        for name, value in [*block.state_dict().items(), *extra.items()]:
            if value.ndim >= 2:
                value = torch.randn(value.shape) * 0.02
            else:  # norms near 1, biases near 0
                base = torch.ones if name.endswith("norm.weight") else torch.zeros
                value = base(value.shape) + torch.randn(value.shape) * 0.02
            for saved, part in _per_expert(name, value):
                tensors[f"model.layers.{i}.{saved}"] = part.contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _per_expert(name: str, value):
    """``(name, tensor)`` as checkpoints store them: transformers holds a layer's experts
    fused (``experts.gate_up_proj``, ``experts.down_proj``) and saves them one by one."""
    if name.endswith("experts.gate_up_proj"):
        half = value.shape[1] // 2
        stem = name.removesuffix("gate_up_proj")
        for e in range(value.shape[0]):
            yield f"{stem}{e}.gate_proj.weight", value[e, :half]
            yield f"{stem}{e}.up_proj.weight", value[e, half:]
    elif name.endswith("experts.down_proj"):
        stem = name.removesuffix("down_proj")
        for e in range(value.shape[0]):
            yield f"{stem}{e}.down_proj.weight", value[e]
    else:
        yield name, value


def make(name: str, llama_cpp: Path, deps: Path) -> None:
    import torch
    import transformers
    from llama_like import VOCAB_SIZE

    from tessera.testing.models import (
        CHATML_TEMPLATE,
        EOT,
        make_hf_dir,
        train_fallback_tokenizer,
        vocab_from_tokenizer_json,
    )

    f = fixtures()[name]
    tokenizer = with_special_tokens(train_fallback_tokenizer(VOCAB_SIZE), f.special_tokens)
    vocab = vocab_from_tokenizer_json(tokenizer, CHATML_TEMPLATE, EOT)
    shutil.rmtree(f.folder, ignore_errors=True)
    hf = dict(f.hf)
    make_hf_dir(
        f.hf_dir, f.hf_type, seed=f.seed, tie_word_embeddings=f.tied, hf_overrides=hf,
        vocab=vocab, **f.dims,
    )  # fmt: skip
    write_tokenizer_config(f, f.hf_dir, vocab.eos_token)
    if f.nextn:
        append_nextn_blocks(f.hf_dir, f.nextn, f.seed)
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
            module="deepseek2_fixtures" if f.arch == "deepseek2" else "llama_like",
            extra=(
                f" plus the special tokens {', '.join(f'`{t}`' for t in f.special_tokens)}"
                if f.special_tokens
                else ""
            )
            + (
                f"; {f.nextn} MTP block(s) appended after the main ones (`append_nextn_blocks`)"
                if f.nextn
                else ""
            ),
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
    llama_cpp, deps, *names = argv
    for name in names or fixtures():
        make(name, Path(llama_cpp), Path(deps))


if __name__ == "__main__":
    main(sys.argv[1:])

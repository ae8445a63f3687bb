"""Makes the qwen3_next fixtures under ``tests/data/arch/qwen3_next/``:

- ``hf/``: a random-weight ``Qwen3NextForCausalLM`` that transformers writes (float32);
- ``qwen3next-f32.gguf``: what llama.cpp's own converter writes from it (``--outtype f32``);
- ``qwen3next-yarn-f32.gguf``: the converter's file of the same folder with :data:`YARN`'s
  changes to its ``config.json`` (the tests make that folder again from ``hf/``);
- ``README.md``: how they were made.

Not run in CI (CI has no llama.cpp); the tests read the committed files. Run::

    .venv/bin/python tests/data/arch/make_fixture_qwen3_next.py LLAMA_CPP

with ``LLAMA_CPP`` the llama.cpp source tree (``convert_hf_to_gguf.py`` and ``gguf-py``).
The converter runs in a child process, unchanged but for one thing: it recognizes a BPE
vocabulary by the hash of its tokens for a test string, and the test vocabulary is in none
of its tables, so where it gives up the script answers ``gpt-2``, the test vocabulary's
real pre-tokenizer (GPT-2's byte-level regex).
"""

from __future__ import annotations

import json
import platform
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "qwen3_next"
#: Qwen3's chat template, as its checkpoints ship it (the Qwen3-Next ones carry the same).
TEMPLATE = HERE.parent / "chat-templates" / "Qwen-Qwen3-0.6B.jinja"
SEED = 37
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 320
#: Tiny dims with Qwen3-Next's structure: gated delta-net layers and gated full attention
#: in turn (interval 2), more value heads than key heads in the delta net (2 per key
#: head), partial RoPE (a quarter of the head), 4 experts of which 2 per token plus a
#: gated shared expert in every layer.
CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "norm_topk_prob": True,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
#: The YaRN variant's config.json changes: Qwen3-Next's long-context recipe (factor 4), over
#: an original context short enough that this model's two rotated pairs fall on both ends
#: of YaRN's ramp.
YARN = {
    "max_position_embeddings": 256,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}
#: Weights N(0, 0.1) (norm weights 0.1 noise around transformers' zero, i.e. around 1),
#: the router N(0, 0.5) so the top-2 choice is decisive; A_log and dt_bias keep
#: transformers' own initialization (decays spread over [0.01, 16]).
STD = {"router": 0.5, "norm": 0.1, "other": 0.1}
README = """# `qwen3_next`: a random-weight Qwen3NextForCausalLM and llama.cpp's GGUF of it

- `hf/`: written by transformers {transformers} (torch {torch}, float32) from
  `Qwen3NextConfig` under `torch.manual_seed({seed})`: 4 layers (gated delta net, gated
  full attention, in turn: `full_attention_interval` 2), 64 wide; the delta net with 2 key
  heads and 4 value heads of 16, a causal conv of 4; attention with 4 query heads of 16,
  2 KV heads, RoPE on a quarter of each head; 4 experts of 32, 2 per token, and a gated
  shared expert of 48 in every layer. Weights N(0, 0.1), the router's N(0, 0.5), norm
  weights 0.1 noise around 0 (Qwen3-Next norms scale by `1 + w`); `A_log`, `dt_bias` as
  transformers initializes them. Vocabulary: a {vocab}-token byte-level BPE trained on
  Python's pydoc topics with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as specials;
  `tokenizer_config.json` carries Qwen3's chat template
  (`tests/data/chat-templates/Qwen-Qwen3-0.6B.jinja`).
- `qwen3next-f32.gguf`: `convert_hf_to_gguf.py hf --outtype f32 --no-mtp` of the llama.cpp sources
  vendored by llama-cpp-python 0.3.36 (with its `gguf-py`; its `Qwen3NextModel`),
  answering `gpt-2` for the test vocabulary's unknown pre-tokenizer hash.
- `qwen3next-yarn-f32.gguf`: the same conversion of `hf/` with `config.json`'s
  `rope_parameters` set to YaRN, factor 4 over an original context of 64, and
  `max_position_embeddings` 256 (`YARN` in the script; the tests rebuild that folder).

Made by `tests/data/arch/make_fixture_qwen3_next.py` (Python {python}); not made in CI.
"""


def train_tokenizer() -> str:
    """``tokenizer.json``: a small byte-level BPE with Qwen's chat markers as specials."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([topics[k] for k in sorted(topics)], trainer)
    return tok.to_str()


def make_checkpoint(folder: Path, tokenizer_json: str) -> None:
    import torch
    import transformers

    config = transformers.Qwen3NextConfig(**CONFIG)
    torch.manual_seed(SEED)
    model = transformers.Qwen3NextForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, STD["router"])
            elif "norm" in name:
                param.normal_(0.0, STD["norm"])
            else:
                param.normal_(0.0, STD["other"])
    model.generation_config.eos_token_id = CONFIG["eos_token_id"]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))


def convert_in_child(llama_cpp: Path, src: Path, out: Path) -> None:
    """Run llama.cpp's converter on ``src`` in this process (the child's job)."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    from conversion import base

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:  # the test vocabulary: GPT-2's pre-tokenizer
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    # --no-mtp: the checkpoint has no MTP block (the converter otherwise expects one)
    sys.argv = [
        "convert_hf_to_gguf.py",
        str(src),
        "--outtype",
        "f32",
        "--no-mtp",
        "--outfile",
        str(out),
    ]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")


def main(argv: list[str]) -> None:
    if argv[:1] == ["--convert"]:
        convert_in_child(*(Path(a) for a in argv[1:4]))
        return
    import torch
    import transformers

    llama_cpp = Path(argv[0])
    shutil.rmtree(OUT, ignore_errors=True)
    make_checkpoint(OUT / "hf", train_tokenizer())
    gguf = OUT / "qwen3next-f32.gguf"
    cmd = [sys.executable, __file__, "--convert", str(llama_cpp), str(OUT / "hf"), str(gguf)]
    subprocess.run(cmd, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        yarn = Path(tmp) / "hf-yarn"
        shutil.copytree(OUT / "hf", yarn)
        config = json.loads((yarn / "config.json").read_text())
        (yarn / "config.json").write_text(json.dumps(config | YARN, indent=2))
        out = OUT / "qwen3next-yarn-f32.gguf"
        cmd = [sys.executable, __file__, "--convert", str(llama_cpp), str(yarn), str(out)]
        subprocess.run(cmd, check=True)
    (OUT / "README.md").write_text(
        README.format(
            transformers=transformers.__version__,
            torch=torch.__version__,
            seed=SEED,
            vocab=VOCAB_SIZE,
            python=platform.python_version(),
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])

"""Make the Gemma fixtures under tests/data/arch/: per family a random-weight checkpoint made
by transformers (``FAMILY/hf/``), the GGUF llama.cpp's own converter writes from it
(``FAMILY/FAMILY-f32.gguf``) and a README saying how (``FAMILY/README.md``).

The tests read them and never run this script (CI has no llama.cpp). It needs the test
extra's packages plus ``sentencepiece`` (for the tokenizer.model, which llama.cpp's Gemma
converters read) and a llama.cpp source tree::

    python tests/data/arch/make_fixtures_gemma.py --llama-cpp PATH/TO/llama.cpp [gemma2 gemma3]

What it writes is fixed by the constants below: the same packages give the same files.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE.parent / "chat-templates"

#: The tokenizer every family gets: a SentencePiece BPE with byte fallback, as Gemma's, with
#: Gemma's special tokens at Gemma's ids (pad 0, eos 1, bos 2, unk 3) and its turn markers.
SPM_VOCAB = 512
TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")
SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}

#: Tiny dims shared by the families: 4 query heads of 16 over a 32-wide stream (so the
#: attention width is not n_embd), 2 KV heads, and a window of 4 positions, shorter than
#: the tests' prompts. Weights are N(0, 0.1): large enough that the caps and norms matter.
DIMS = {
    "vocab_size": SPM_VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    # llama.cpp derives the attention scale from the head width (n_embd / n_head for 27B)
    "query_pre_attn_scalar": 16,
    "sliding_window": 4,
    "max_position_embeddings": 128,
    "initializer_range": 0.1,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}
FAMILIES = {
    # every other layer slides; caps well inside the scores' and logits' spread
    "gemma2": {
        "config": "Gemma2Config",
        "model": "Gemma2ForCausalLM",
        "template": "google-gemma-2-2b-it.jinja",
        "seed": 2,
        "about": "4 layers, sliding and global in turn; attention scores capped at 1, "
        "final logits at 2",
        "fields": {
            "num_hidden_layers": 4,
            "attn_logit_softcapping": 1.0,
            "final_logit_softcapping": 2.0,
        },
    },
    # 7 layers: five sliding, the global layer 5, one sliding again (llama.cpp's period 6);
    # local RoPE base 10000, global 1e6 with linear scaling by 8 (as the 4B+ models)
    "gemma3": {
        "config": "Gemma3TextConfig",
        "model": "Gemma3ForCausalLM",
        "template": "google-gemma-3-it.jinja",
        "seed": 3,
        "about": "7 layers, five sliding, the global layer 5, one sliding; RoPE base 10000 "
        "on sliding layers, 1e6 with linear scaling by 8 on the global one",
        "fields": {
            "num_hidden_layers": 7,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    },
}
README = """# `{family}`: a random-weight {model} checkpoint and llama.cpp's GGUF of it

- `hf/`: written by transformers {transformers} (torch {torch}, float32) with `{model}`
  from `{config}` under `torch.manual_seed({seed})`:
  {about}.
  Like the other Gemma fixtures: 32 wide, 4 query heads of 16, 2 KV heads, FFN 64,
  window 4, weights N(0, 0.1), norm weights 0 + N(0, 0.1) (applied as 1 + w),
  `query_pre_attn_scalar` 16 (the head width: the scale llama.cpp derives, GGUF does not
  store it). `tokenizer.model`: a
  512-piece SentencePiece BPE (sentencepiece {sentencepiece}) with byte fallback trained on
  Python's `pydoc_data` help topics, Gemma's special tokens at Gemma's ids (`<pad>` 0,
  `<eos>` 1, `<bos>` 2, `<unk>` 3, `<start_of_turn>` 4, `<end_of_turn>` 5);
  `tokenizer_config.json`: those tokens and the chat template
  `tests/data/chat-templates/{template}`.
  No `tokenizer.json` (tessera reads byte-level BPE ones only): a folder load has no
  tokenizer; the GGUF carries the vocabulary.
- `{family}-f32.gguf`: `convert_hf_to_gguf.py hf --outtype f32 --outfile {family}-f32.gguf
  --model-name tessera-test-{family}` of the llama.cpp sources in
  `{llama_cpp}`,
  with their own `gguf-py` on `PYTHONPATH`.

Both were made by `tests/data/arch/make_fixtures_gemma.py` (its constants fix every setting;
run again, it writes the same `hf/` files byte for byte):

    pip install sentencepiece protobuf     # beside the test extra
    python tests/data/arch/make_fixtures_gemma.py --llama-cpp LLAMA_CPP {family}

The checkpoint is committed rather than rebuilt from the seed in each test run, so a change
in how transformers initializes weights cannot change the oracle's input: the parity test
(`tests/models/test_{family}_parity.py`) runs transformers on `hf/` itself. The tests never
run the script.
"""
#: Gemma initializes norm weights (used as 1 + w) to 0: noise makes a loader that drops the
#: offset fail.
NORM_NOISE = 0.1


def train_tokenizer() -> bytes:
    """tokenizer.model: SentencePiece BPE trained on Python's help topics (pydoc_data)."""
    from pydoc_data.topics import topics

    import sentencepiece as spm

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=SPM_VOCAB,
        byte_fallback=True,
        character_coverage=1.0,
        add_dummy_prefix=False,  # Gemma's tokenizer adds no leading space
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece=SPECIAL["pad"],
        eos_piece=SPECIAL["eos"],
        bos_piece=SPECIAL["bos"],
        unk_piece=SPECIAL["unk"],
        user_defined_symbols=list(TURN_TOKENS),
        num_threads=1,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    return model.getvalue()


def tokenizer_config(template: str) -> dict:
    """tokenizer_config.json: the special tokens, BOS added, and the family's chat template."""
    ids = {text: i for i, text in enumerate(SPECIAL.values())}
    ids |= {text: 4 + i for i, text in enumerate(TURN_TOKENS)}
    return {
        "tokenizer_class": "GemmaTokenizer",
        **{f"{name}_token": text for name, text in SPECIAL.items()},
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": text, "special": True, "normalized": False}
            for text, i in ids.items()
        },
        "chat_template": template,
    }


def make_checkpoint(family: str, folder: Path, spm_model: bytes) -> None:
    import torch
    import transformers

    spec = FAMILIES[family]
    config = getattr(transformers, spec["config"])(**DIMS, **spec["fields"])
    torch.manual_seed(spec["seed"])
    model = getattr(transformers, spec["model"])(config).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * NORM_NOISE)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (folder / "tokenizer.model").write_bytes(spm_model)
    template = (TEMPLATES / spec["template"]).read_text(encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(template), indent=2) + "\n", encoding="utf-8"
    )


def convert(llama_cpp: Path, folder: Path, outfile: Path, name: str) -> None:
    """llama.cpp's convert_hf_to_gguf.py with its own gguf-py, f32 tensors."""
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    command = [
        sys.executable,
        str(llama_cpp / "convert_hf_to_gguf.py"),
        str(folder),
        "--outtype",
        "f32",
        "--outfile",
        str(outfile),
        "--model-name",
        name,
    ]
    subprocess.run(command, check=True, env=env)


def write_readme(family: str, llama_cpp: Path) -> None:
    import sentencepiece
    import torch
    import transformers

    spec = FAMILIES[family]
    text = README.format(
        family=family,
        llama_cpp=llama_cpp,
        transformers=transformers.__version__,
        torch=torch.__version__,
        sentencepiece=sentencepiece.__version__,
        **{k: v for k, v in spec.items() if k != "fields"},
    )
    (HERE / family / "README.md").write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, required=True, help="llama.cpp source tree")
    parser.add_argument("families", nargs="*", help=f"of {', '.join(FAMILIES)} (default all)")
    args = parser.parse_args()
    unknown = set(args.families) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; choose from {sorted(FAMILIES)}")
    spm_model = train_tokenizer()
    for family in args.families or sorted(FAMILIES):
        folder = HERE / family / "hf"
        make_checkpoint(family, folder, spm_model)
        outfile = HERE / family / f"{family}-f32.gguf"
        convert(args.llama_cpp, folder, outfile, f"tessera-test-{family}")
        write_readme(family, args.llama_cpp)


if __name__ == "__main__":
    main()

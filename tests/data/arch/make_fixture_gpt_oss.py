"""Makes the gpt-oss fixtures under ``tests/data/arch/gpt-oss/``:

- ``hf/``: a random-weight ``GptOssForCausalLM`` that transformers writes (float32);
- ``gpt-oss-f32.gguf``: what llama.cpp's own converter writes from it (``--outtype f32``;
  unquantized experts stay F32);
- ``hf-mxfp4/``: the same model with its experts in MXFP4, stored as OpenAI ships gpt-oss
  (``*_blocks`` / ``*_scales`` uint8 tensors, ``quantization_config.quant_method`` mxfp4);
- ``gpt-oss-mxfp4.gguf``: what llama.cpp's converter writes from that folder (it repacks the
  experts into GGML's MXFP4 blocks, as the published gpt-oss GGUFs have them);
- ``gpt-oss-MXFP4_MOE.gguf``: ``llama-quantize gpt-oss-f32.gguf ... MXFP4_MOE``;
- ``README.md``: how they were made.

Not run in CI (CI has no llama.cpp); the tests read the committed files. Run::

    .venv/bin/python tests/data/arch/make_fixture_gpt_oss.py LLAMA_CPP

with ``LLAMA_CPP`` the llama.cpp source tree (``convert_hf_to_gguf.py``, ``gguf-py`` and a
built ``build/bin/llama-quantize``). The converter runs in a child process, unchanged but
for one thing: it recognizes a BPE vocabulary by the hash of its tokens for a test string,
and the test vocabulary is in none of its tables, so where it gives up the script answers
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

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "gpt-oss"
TEMPLATE = HERE.parent / "chat-templates" / "openai-gpt-oss-120b.jinja"
SEED = 31
#: The harmony format's special tokens (the gpt-oss vocabulary has them at 199998 and up).
SPECIALS = (
    "<|startoftext|>",
    "<|endoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
)
VOCAB_SIZE = 384
#: Tiny dims; the layer pattern, RoPE and expert settings are gpt-oss's own: layers slide
#: and attend fully in turn, YaRN x32 from 4096 positions with transformers' untruncated
#: correction range, 4 experts of 6 per token, the clamped SwiGLU at its default alpha and
#: limit (llama.cpp's constants). The window (4) is shorter than the tests' prompts.
CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_local_experts": 6,
    "num_experts_per_tok": 4,
    "sliding_window": 4,
    "max_position_embeddings": 131072,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    "rms_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}
#: Standard deviations of the random weights: the expert projections are wide enough that
#: the SwiGLU's clamps (7) bite, the router decisive, the sinks of the order of the scores.
STD = {"experts": 0.6, "router": 0.5, "sinks": 1.0, "other": 0.1, "bias": 0.1}
README = """# `gpt-oss`: a random-weight GptOssForCausalLM, its MXFP4 form and llama.cpp's GGUFs

- `hf/`: written by transformers {transformers} (torch {torch}, float32) from `GptOssConfig`
  under `torch.manual_seed({seed})`: 2 layers (sliding window 4, then full attention),
  64 wide, 4 query heads of 16, 2 KV heads, 6 experts of 64, 4 per token, YaRN (factor 32,
  original context 4096, base 150000, `truncate: false` as gpt-oss ships it); weights
  N(0, 0.1) but the experts' N(0, 0.6) (so the SwiGLU clamps at 7 bite), the router's
  N(0, 0.5), the sinks' N(0, 1), biases and norms N(0, 0.1) noise (norms around 1).
  Vocabulary: a {vocab}-token byte-level BPE trained on Python's pydoc topics with the
  harmony tokens (`<|start|>`, `<|channel|>`, `<|message|>`, `<|end|>`, `<|return|>`,
  `<|call|>`, `<|constrain|>` ...) as special tokens; chat template
  `tests/data/chat-templates/openai-gpt-oss-120b.jinja`.
- `hf-mxfp4/`: the same weights with each expert projection quantized to MXFP4 (by
  `gguf.quants`, as llama.cpp quantizes) and stored in OpenAI's layout: per row of 32
  values an E8M0 scale byte (`*_scales`) and 16 bytes of E2M1 codes, value 2k in the low
  nibble and 2k+1 in the high one (`*_blocks`); gate and up rows interleaved;
  `quantization_config: {{"quant_method": "mxfp4"}}`. transformers dequantizes it on load.
- `gpt-oss-f32.gguf`, `gpt-oss-mxfp4.gguf`: `convert_hf_to_gguf.py FOLDER --outtype f32` of
  the llama.cpp sources vendored by llama-cpp-python 0.3.36 (with its `gguf-py`) on `hf/`
  and on `hf-mxfp4/`, answering `gpt-2` for the test vocabulary's unknown pre-tokenizer
  hash. From `hf/` the experts stay F32; from `hf-mxfp4/` the converter repacks them as
  GGML MXFP4 ({mxfp4_note}).
- `gpt-oss-MXFP4_MOE.gguf`: `llama-quantize gpt-oss-f32.gguf gpt-oss-MXFP4_MOE.gguf MXFP4_MOE`
  of the same sources ({mix_note}).
  `tests/data/quants/mixes/gpt-oss.json` records the type llama-quantize gives each
  tensor of `gpt-oss-f32.gguf` for every file type (`record_mixes.py` there).

Made by `tests/data/arch/make_fixture_gpt_oss.py` (Python {python}); not made in CI. The
checkpoints are committed rather than rebuilt in each test run, so a change in how
transformers initializes weights cannot change the oracle's input.
"""


def train_tokenizer() -> str:
    """``tokenizer.json``: a byte-level BPE with the harmony tokens as special tokens."""
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


def write_tokenizer(folder: Path, tokenizer_json: str) -> None:
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def make_checkpoint(folder: Path, tokenizer_json: str) -> None:
    import torch
    import transformers

    config = transformers.GptOssConfig(**CONFIG)
    torch.manual_seed(SEED)
    model = transformers.GptOssForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "experts" in name and not name.endswith("_bias"):
                param.normal_(0.0, STD["experts"])
            elif "router" in name:
                param.normal_(0.0, STD["router"])
            elif name.endswith("sinks"):
                param.normal_(0.0, STD["sinks"])
            elif name.endswith(("_bias", ".bias")):
                param.normal_(0.0, STD["bias"])
            elif "norm" in name:
                param.copy_(1.0 + STD["bias"] * torch.randn_like(param))
            else:
                param.normal_(0.0, STD["other"])
    model.generation_config.eos_token_id = CONFIG["eos_token_id"]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    write_tokenizer(folder, tokenizer_json)


def openai_mxfp4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(blocks, scales)`` of float32 ``(..., n)`` rows in OpenAI's MXFP4 layout: GGML's
    quantization (gguf.quants, bit-exact with llama.cpp), its codes re-packed two per byte
    in order (GGML puts value j in the low nibble and j + 16 in the high one)."""
    import gguf

    q = gguf.quants.quantize(rows.astype(np.float32), gguf.GGMLQuantizationType.MXFP4)
    q = q.reshape(*rows.shape[:-1], rows.shape[-1] // 32, 17)
    scales, packed = q[..., 0], q[..., 1:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # values 0..31 of a block
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, scales.astype(np.uint8)


def make_mxfp4_checkpoint(src: Path, folder: Path) -> None:
    """``src`` with every expert projection as OpenAI's ``_blocks`` / ``_scales``."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    out = {}
    for name, value in tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            # transformers keeps (E, in, out); the blocks run along the input, per output row
            blocks, scales = openai_mxfp4(np.swapaxes(value, 1, 2))
            out[name + "_blocks"], out[name + "_scales"] = blocks, scales
        else:
            out[name] = value
    folder.mkdir(parents=True, exist_ok=True)
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for extra in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / extra, folder / extra)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


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
    sys.argv = ["convert_hf_to_gguf.py", str(src), "--outtype", "f32", "--outfile", str(out)]
    runpy.run_path(str(llama_cpp / "convert_hf_to_gguf.py"), run_name="__main__")


def convert(llama_cpp: Path, src: Path, out: Path) -> None:
    cmd = [sys.executable, __file__, "--convert", str(llama_cpp), str(src), str(out)]
    subprocess.run(cmd, check=True)


def tensor_types(path: Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--convert"]:
        convert_in_child(*(Path(a) for a in argv[1:4]))
        return
    import torch
    import transformers

    llama_cpp = Path(argv[0])
    shutil.rmtree(OUT, ignore_errors=True)
    tokenizer_json = train_tokenizer()
    make_checkpoint(OUT / "hf", tokenizer_json)
    make_mxfp4_checkpoint(OUT / "hf", OUT / "hf-mxfp4")
    convert(llama_cpp, OUT / "hf", OUT / "gpt-oss-f32.gguf")
    convert(llama_cpp, OUT / "hf-mxfp4", OUT / "gpt-oss-mxfp4.gguf")
    quantize = llama_cpp / "build" / "bin" / "llama-quantize"
    mix = OUT / "gpt-oss-MXFP4_MOE.gguf"
    subprocess.run(
        [str(quantize), str(OUT / "gpt-oss-f32.gguf"), str(mix), "MXFP4_MOE"], check=True
    )
    experts = tensor_types(OUT / "gpt-oss-mxfp4.gguf").items()
    mxfp4 = sorted({t for n, t in experts if n.endswith("exps.weight")})
    mixed = sorted(set(tensor_types(mix).values()))
    (OUT / "README.md").write_text(
        README.format(
            transformers=transformers.__version__,
            torch=torch.__version__,
            seed=SEED,
            vocab=VOCAB_SIZE,
            python=platform.python_version(),
            mxfp4_note="expert matrices: " + ", ".join(mxfp4) + "; their biases F32",
            mix_note="tensor types: " + ", ".join(mixed),
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])

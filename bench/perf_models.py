"""Model files for bench/perf_vs_llamacpp.py: one GGUF per (model, type), made once and reused.

A named shape (:mod:`tessera.testing.shapes`, e.g. ``qwen2-0.5b``) becomes a random-weight
F16 GGUF with the shape's real vocabulary size (the default model's BPE vocabulary padded
with user-defined ``<|pad_N|>`` tokens, so llama.cpp loads it too); ``default`` is the
bundled model. Quantized variants come from ``tessera quantize`` (llama.cpp's per-tensor
type rules). Files are cached in the work folder by name, since writing and quantizing a
0.5B model takes minutes on a busy 2-core machine; a file of a type tessera does not make
(the grid types IQ1_S ... IQ3_S: llama-quantize makes them, some only from an importance
matrix) is used when it is there under the same name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tessera.files.gguf_writer import encode_tensor, write_gguf
from tessera.files.load import default_model_path
from tessera.plugins.cmd.quantize import quantize_model
from tessera.testing.models import default_vocab
from tessera.testing.shapes import SHAPES, shape_config

#: --type names -> tessera quantize targets: llama-quantize's file types (the mixes with
#: its per-tensor types) and the plain K types.
TYPES = {name: name for name in (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
    "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0",
    "TQ2_0", "MXFP4_MOE", "Q3_K", "Q4_K", "Q5_K",
)}  # fmt: skip
#: Vocabulary sizes of the real models behind the shapes (the shapes shrink them).
REAL_VOCAB = {"qwen2-0.5b": 151936, "qwen3-0.6b": 151936, "llama-1b": 128256}


def padded_vocab(n_vocab: int) -> dict[str, Any]:
    """The default model's tokenizer keys with user-defined tokens added up to ``n_vocab``."""
    meta = dict(default_vocab().gguf_metadata)
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta["tokenizer.ggml.token_type"])
    extra = n_vocab - len(tokens)
    if extra < 0:
        raise SystemExit(f"--vocab must be at least {len(tokens)} (the BPE vocabulary's size)")
    meta["tokenizer.ggml.tokens"] = tokens + [f"<|pad_{i}|>" for i in range(extra)]
    meta["tokenizer.ggml.token_type"] = types + [4] * extra  # 4: user-defined
    return meta


def write_shape_gguf(path: Path, runtime: Any, shape: str, n_vocab: int, seed: int = 0) -> Path:
    """A random-weight F16 GGUF of ``shape`` with ``n_vocab`` tokens (weights N(0, 0.02))."""
    arch, config = shape_config(runtime, shape, n_vocab)
    rng = np.random.default_rng(seed)
    # a shared pool at random offsets: billions of fresh normals would take minutes
    pool = rng.standard_normal(1 << 22, dtype=np.float32) * np.float32(0.02)
    fixed = arch.example_tensors(config)
    f16 = runtime.quant_type_by_name("F16")
    f32 = runtime.quant_type_by_name("F32")
    tensors = []
    for name, shape_ in arch.tensor_shapes(config).items():
        values = fixed.get(name)
        if values is None:
            n = int(np.prod(shape_))
            values = np.resize(np.roll(pool, -int(rng.integers(len(pool)))), n).reshape(shape_)
            if len(shape_) == 1 and name.endswith("norm.weight"):
                values = values + np.float32(1.0)
        qtype = f16 if len(shape_) == 2 else f32  # llama.cpp keeps 1-D tensors in F32
        tensors.append(encode_tensor(name, np.asarray(values, np.float32), qtype))
    metadata = {
        **arch.gguf_metadata(config),
        "general.type": "model",
        "general.name": f"random {shape} (vocab {n_vocab})",
        **padded_vocab(n_vocab),
    }
    return write_gguf(path, metadata, tensors)


def model_file(work: Path, runtime: Any, model: str, qtype: str, n_vocab: int | None) -> Path:
    """The GGUF of ``model`` (a shape name or ``default``) in ``qtype``, made when missing."""
    work.mkdir(parents=True, exist_ok=True)
    if model == "default":
        base = default_model_path()
        stem = "default"
    elif model in SHAPES:
        n_vocab = n_vocab or REAL_VOCAB.get(model, 8192)
        stem = f"{model}-v{n_vocab}"
        base = work / f"{stem}-F16.gguf"
        if not base.exists():
            print(f"writing {base} ...", flush=True)
            write_shape_gguf(base, runtime, model, n_vocab)
    else:
        raise SystemExit(f"unknown model '{model}'; use 'default' or one of: {', '.join(SHAPES)}")
    out = work / f"{stem}-{qtype}.gguf"
    if not out.exists() and qtype not in TYPES:  # e.g. the grid types: an imatrix's job
        raise SystemExit(
            f"tessera quantize does not make {qtype} files; put one at {out} (e.g. "
            f"llama-quantize {base} {out} {qtype}) or use one of: {', '.join(TYPES)}"
        )
    if not out.exists():
        print(f"quantizing {base.name} -> {out.name} ...", flush=True)
        quantize_model(base, out, TYPES[qtype], runtime)
    return out


def hf_config(model: Any) -> Any:
    """A transformers config of a loaded tessera llama/qwen2/qwen3 model (same shape)."""
    from transformers import AutoConfig

    from tessera.contract.arch import HF_DIM_NAMES, hf_dims

    c = model.config
    return AutoConfig.for_model(
        c.arch,
        **hf_dims({name: getattr(c, name) for name in HF_DIM_NAMES}),
        rope_theta=c.rope_freq_base,
        rms_norm_eps=c.rms_eps,
        tie_word_embeddings=c.tied_embeddings,
        max_position_embeddings=4096,
    )

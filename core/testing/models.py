"""Random-weight test models written as real files: GGUF for any architecture, HF folders.

:func:`make_gguf` builds a model of any registered architecture from its
:meth:`~tessera.contract.arch.Architecture.example_config` alone, so an architecture plugin gets
test models for free. :func:`make_hf_dir` writes a genuine Hugging Face checkpoint made
by ``transformers`` itself (the oracle in parity tests).

Both use the default model's vocabulary; until the bundled default GGUF exists, a small
byte-level BPE vocabulary trained deterministically on Python's own help topics
(``pydoc_data``) stands in for it.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import hf_dims
from tessera.files.gguf_writer import encode_tensor, storage_types, write_gguf

#: Generic model sizes (GGUF terms), overridable one by one.
SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 128},
    "small": {"n_embd": 256, "n_layer": 4, "n_head": 8, "n_head_kv": 4, "n_ff": 512},
}
#: Standard deviation of random weights (HF's default ``initializer_range``).
WEIGHT_STD = 0.02

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FALLBACK_VOCAB_SIZE = 512
#: Mixture-of-experts dims (GGUF terms, as ``make_gguf`` takes them) -> HF config fields.
HF_MOE_FIELDS = {
    "n_expert": "num_experts",
    "n_expert_used": "num_experts_per_tok",
    "n_ff_exp": "moe_intermediate_size",
    "n_ff_shexp": "shared_expert_intermediate_size",
    "norm_topk_prob": "norm_topk_prob",
}


@attrs.frozen
class TestVocab:
    """A vocabulary in both forms a model file carries it in."""

    __test__ = False  # not a pytest test class

    #: ``tokenizer.*`` GGUF keys (llama.cpp names), chat template included.
    gguf_metadata: Mapping[str, Any]
    #: HF ``tokenizer.json`` text.
    tokenizer_json: str
    chat_template: str
    eos_token: str

    @property
    def n_vocab(self) -> int:
        return len(self.gguf_metadata["tokenizer.ggml.tokens"])

    @property
    def eos_token_id(self) -> int:
        return int(self.gguf_metadata["tokenizer.ggml.eos_token_id"])

    def write_hf_files(self, folder: Path) -> None:
        """``tokenizer.json`` and ``tokenizer_config.json`` (with the chat template)."""
        (folder / "tokenizer.json").write_text(self.tokenizer_json, encoding="utf-8")
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": self.eos_token,
            "pad_token": self.eos_token,
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": False,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def train_fallback_tokenizer(vocab_size: int = FALLBACK_VOCAB_SIZE) -> str:
    """``tokenizer.json`` of a GPT-2-style byte-level BPE trained on ``pydoc_data`` topics.

    The same text and settings give the same vocabulary on every run.
    """
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([topics[k] for k in sorted(topics)], trainer)
    return tok.to_str()


def vocab_from_tokenizer_json(tokenizer_json: str, chat_template: str, eos_token: str) -> TestVocab:
    """A :class:`TestVocab` from HF tokenizer files, via tessera's own tokenizer converter."""
    from tessera.text.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        vocab = TestVocab({}, tokenizer_json, chat_template, eos_token)
        vocab.write_hf_files(folder)
        metadata = dict(Tokenizer.from_hf_dir(folder).gguf_metadata())
    metadata.setdefault("tokenizer.chat_template", chat_template)
    return TestVocab(metadata, tokenizer_json, chat_template, eos_token)


def vocab_from_gguf(path: Path) -> TestVocab:
    """The vocabulary of a GGUF file (the bundled default model)."""
    from tessera.files.gguf import read_gguf
    from tessera.text.tokenizer import Tokenizer

    metadata = read_gguf(path).metadata
    tok_meta = {k: v for k, v in metadata.items() if k.startswith("tokenizer.")}
    Tokenizer.from_gguf_metadata(tok_meta)  # the vocabulary must be one tessera can use
    eos = tok_meta["tokenizer.ggml.tokens"][int(tok_meta["tokenizer.ggml.eos_token_id"])]
    template = str(tok_meta.get("tokenizer.chat_template", CHATML_TEMPLATE))
    return TestVocab(tok_meta, tokenizer_json_from_gguf(tok_meta), template, eos)


def tokenizer_json_from_gguf(metadata: Mapping[str, Any]) -> str:
    """HF ``tokenizer.json`` for a GGUF byte-level BPE (``gpt2``) vocabulary.

    Tokens keep their ids; merges keep their rank; control tokens become special tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre not in (None, "default", "gpt-2"):
        raise ValueError(
            "test HF folders need a GPT-2-style byte-level BPE vocabulary (model gpt2, "
            f"pre-tokenizer gpt-2), got model '{model}' with pre-tokenizer '{pre}'"
        )
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = metadata.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
    tok.add_special_tokens(
        [AddedToken(t, special=True) for t, ty in zip(tokens, types, strict=True) if ty == control]
    )
    return tok.to_str()


@functools.lru_cache(maxsize=1)
def default_vocab() -> TestVocab:
    """The default model's vocabulary, or the ``pydoc_data`` BPE until that model exists."""
    from tessera.files.load import default_model_path

    path = default_model_path()
    if path.exists():
        return vocab_from_gguf(path)
    return vocab_from_tokenizer_json(train_fallback_tokenizer(), CHATML_TEMPLATE, EOT)


def random_weights(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Float32 weights by GGUF name: norms near 1, everything else N(0, 0.02)."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        values = rng.normal(0.0, WEIGHT_STD, size=shape).astype(np.float32)
        if len(shape) == 1 and name.endswith("norm.weight"):
            values += 1.0
        weights[name] = values
    return weights


def _dims(size: str, dims: Mapping[str, Any], n_vocab: int) -> dict[str, Any]:
    if size not in SIZES:
        raise ValueError(f"unknown size '{size}'; choose one of: {', '.join(SIZES)}")
    merged = {**SIZES[size], "n_vocab": n_vocab, **dims}
    if merged["n_vocab"] != n_vocab:
        raise ValueError(
            f"n_vocab must equal the test vocabulary's size ({n_vocab}), got {merged['n_vocab']}"
        )
    return merged


def make_gguf(
    path: str | os.PathLike[str],
    arch: str = "llama",
    *,
    size: str = "tiny",
    qtype: str = "f32",
    seed: int = 0,
    runtime: Any = None,
    name: str | None = None,
    metadata_overrides: Mapping[str, Any] | None = None,
    **dims: Any,
) -> Path:
    """Write a random-weight GGUF model of architecture ``arch``; return its path.

    ``metadata_overrides`` sets metadata keys; a value of None removes the key (e.g.
    ``{"tokenizer.chat_template": None}`` for a model without a chat template).

    ``size`` picks generic dims from :data:`SIZES`; ``dims`` (``n_embd``, ``n_layer``,
    ``n_head``, ``n_head_kv``, ``n_ff`` or any field the architecture's
    ``example_config`` accepts) override them. Tensors are stored as ``qtype`` with
    llama.cpp's per-tensor rules (:func:`tessera.files.gguf_writer.storage_types`).
    """
    from tessera.plugin_manager import Runtime

    runtime = runtime or Runtime()
    architecture = runtime.architecture(arch)
    vocab = default_vocab()
    config = architecture.example_config(arch=arch, **_dims(size, dims, vocab.n_vocab))
    shapes = architecture.tensor_shapes(config)
    types = storage_types(shapes, qtype, runtime.quant_type_by_name)
    weights = random_weights(shapes, seed) | architecture.example_tensors(config)
    tensors = [encode_tensor(n, weights[n], types[n]) for n in shapes]
    metadata = {
        **architecture.gguf_metadata(config),
        "general.type": "model",
        "general.name": name or f"tessera-test-{arch}-{size}",
        **vocab.gguf_metadata,
    }
    for key, value in (metadata_overrides or {}).items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return write_gguf(path, metadata, tensors)


def make_hf_dir(
    path: str | os.PathLike[str],
    arch: str = "llama",
    *,
    size: str = "tiny",
    seed: int = 0,
    tie_word_embeddings: bool = False,
    hf_overrides: Mapping[str, Any] | None = None,
    vocab: TestVocab | None = None,
    **dims: Any,
) -> Path:
    """Write a random-weight Hugging Face folder made by ``transformers``; return its path.

    ``arch`` is the HF ``model_type`` (``llama``, ``qwen2``, ``qwen3`` ...), built with
    ``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)`` in float32;
    1-D parameters (norms, biases) and saved float buffers (DeepSeek's router bias), which
    HF initializes to constants, get N(0, 0.02) noise so that a loader which drops them
    fails parity tests. ``dims`` take the
    generic names of :func:`make_gguf`, and for mixture-of-experts types (``qwen3_moe``,
    ``qwen2_moe``) the expert dims of :data:`HF_MOE_FIELDS`; ``hf_overrides`` sets any
    other ``config.json`` field (``attention_bias``, ``rope_theta`` ...); ``vocab`` replaces
    :func:`default_vocab` (a smaller one keeps committed fixtures small). Writes
    ``config.json``, ``model.safetensors``, ``tokenizer.json`` and ``tokenizer_config.json``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = vocab or default_vocab()
    d = _dims(size, dims, vocab.n_vocab)
    hf = {
        **hf_dims({"head_dim": d["n_embd"] // d["n_head"], **d}),
        "max_position_embeddings": 512,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": vocab.eos_token_id,
        "eos_token_id": vocab.eos_token_id,
        "pad_token_id": vocab.eos_token_id,
        **{hf_name: d[name] for name, hf_name in HF_MOE_FIELDS.items() if name in d},
        **(hf_overrides or {}),
    }
    config = AutoConfig.for_model(arch, **hf)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * WEIGHT_STD)
        saved = model.state_dict()
        for name, buffer in model.named_buffers():  # saved ones: a router's bias ...
            if name in saved and buffer.is_floating_point():
                buffer.add_(torch.randn_like(buffer) * WEIGHT_STD)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    vocab.write_hf_files(path)
    return path

"""The test-model maker: real GGUF files for any registered architecture, real HF folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tessera.files.load
from tessera.contract.arch import Architecture
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.hookspecs import hookimpl
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf, make_hf_dir
from tessera.testing import models as tm


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.mark.parametrize("qtype", ["f32", "q8_0"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_make_gguf_writes_a_model_tessera_loads_and_runs(tmp_path, runtime, arch, qtype):
    path = make_gguf(tmp_path / "m.gguf", arch, qtype=qtype, runtime=runtime)
    gguf = read_gguf(path)
    architecture = runtime.architecture(arch)
    shapes = {n: t.shape for n, t in gguf.tensors.items()}
    config = architecture.config_from_gguf(gguf.metadata, shapes)
    assert shapes == architecture.tensor_shapes(config)
    assert shapes == architecture.tensor_shapes(
        architecture.example_config(arch=arch, n_vocab=config.n_vocab, **tm.SIZES["tiny"])
    )
    assert gguf.metadata["tokenizer.ggml.tokens"] == list(
        tm.default_vocab().gguf_metadata["tokenizer.ggml.tokens"]
    )
    assert config.n_vocab == tm.default_vocab().n_vocab
    model = load_model(path, runtime, runtime.create_backend("numpy"))
    ctx = Context(model, ContextParams(n_ctx=16))
    logits = ctx.decode(Batch.for_sequence([1, 2, 3], logits="all"))
    assert logits.shape == (3, model.n_vocab) and np.isfinite(logits).all()
    assert logits.std() > 1e-3  # weights are not all zero


def test_random_weights_have_the_intended_scale():
    shapes = {"token_embd.weight": (300, 64), "blk.0.attn_norm.weight": (64,), "b.bias": (64,)}
    w = tm.random_weights(shapes, seed=0)
    assert abs(w["token_embd.weight"].std() - tm.WEIGHT_STD) < 2e-3
    assert abs(w["blk.0.attn_norm.weight"].mean() - 1.0) < 0.01
    assert abs(w["b.bias"].mean()) < 0.01


def test_same_seed_same_file_other_seed_other_weights(tmp_path, runtime):
    a = make_gguf(tmp_path / "a.gguf", runtime=runtime, seed=1).read_bytes()
    b = make_gguf(tmp_path / "b.gguf", runtime=runtime, seed=1).read_bytes()
    c = make_gguf(tmp_path / "c.gguf", runtime=runtime, seed=2).read_bytes()
    assert a == b and len(a) == len(c) and a != c


def test_explicit_dims_override_the_size(tmp_path, runtime):
    path = make_gguf(
        tmp_path / "m.gguf",
        "qwen3",
        runtime=runtime,
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_head_kv=1,
        n_ff=48,
        head_dim=24,
    )
    meta = read_gguf(path).metadata
    assert (meta["qwen3.embedding_length"], meta["qwen3.block_count"]) == (32, 1)
    assert (meta["qwen3.attention.head_count_kv"], meta["qwen3.attention.key_length"]) == (1, 24)
    with pytest.raises(ValueError, match="unknown size"):
        make_gguf(tmp_path / "x.gguf", runtime=runtime, size="huge")
    with pytest.raises(ValueError, match="n_vocab"):
        make_gguf(tmp_path / "x.gguf", runtime=runtime, n_vocab=7)
    assert not (tmp_path / "x.gguf").exists()


class _NoExamples(Architecture):
    names = ("noexample",)

    def config_from_gguf(self, metadata, tensor_shapes): ...
    def config_from_hf(self, hf_config): ...
    def gguf_metadata(self, config): ...
    def tensor_shapes(self, config): ...
    def tensors_from_hf(self, config, hf_tensors, for_gguf): ...
    def kv_layout(self, config): ...
    def build(self, config, weights, backend): ...


class _Plugin:
    TESSERA_PLUGIN_API = 2

    @hookimpl
    def tessera_register_architectures(self, register):
        register(_NoExamples())


def test_an_architecture_without_example_config_gets_a_clear_error(tmp_path):
    runtime = Runtime(entry_points=[])
    assert runtime.add_plugin(_Plugin(), "no-examples")
    with pytest.raises(NotImplementedError, match="example_config"):
        make_gguf(tmp_path / "m.gguf", "noexample", runtime=runtime)


def test_fallback_tokenizer_is_deterministic_and_trained_on_pydoc_topics():
    first = tm.train_fallback_tokenizer()
    assert first == tm.train_fallback_tokenizer()
    vocab = json.loads(first)["model"]["vocab"]
    assert len(vocab) == tm.FALLBACK_VOCAB_SIZE
    assert "Ġstatement" in vocab  # a word of the Python reference it was trained on


def test_vocab_gguf_keys_and_tokenizer_json_agree():
    from tokenizers import Tokenizer

    vocab = tm.vocab_from_tokenizer_json(tm.train_fallback_tokenizer(), tm.CHATML_TEMPLATE, tm.EOT)
    hf = Tokenizer.from_str(vocab.tokenizer_json)
    tokens = vocab.gguf_metadata["tokenizer.ggml.tokens"]
    assert [hf.id_to_token(i) for i in range(len(tokens))] == list(tokens)
    assert tokens[vocab.eos_token_id] == tm.EOT
    assert vocab.gguf_metadata["tokenizer.chat_template"] == tm.CHATML_TEMPLATE


def test_tokenizer_json_rebuilt_from_gguf_encodes_like_the_original():
    from tokenizers import Tokenizer

    vocab = tm.vocab_from_tokenizer_json(tm.train_fallback_tokenizer(), tm.CHATML_TEMPLATE, tm.EOT)
    original = Tokenizer.from_str(vocab.tokenizer_json)
    rebuilt = Tokenizer.from_str(tm.tokenizer_json_from_gguf(vocab.gguf_metadata))
    text = "The for statement<|endoftext|>  is used to iterate über\n\telements 123."
    assert rebuilt.encode(text).ids == original.encode(text).ids


def test_default_vocab_comes_from_the_bundled_model_when_it_exists(tmp_path, runtime, monkeypatch):
    bundled = make_gguf(tmp_path / "default.gguf", runtime=runtime)
    tm.default_vocab.cache_clear()
    monkeypatch.setattr(tessera.files.load, "default_model_path", lambda: bundled)
    try:
        vocab = tm.default_vocab()
        assert vocab.gguf_metadata == {
            k: v for k, v in read_gguf(bundled).metadata.items() if k.startswith("tokenizer.")
        }
        assert vocab.eos_token == tm.EOT
    finally:
        tm.default_vocab.cache_clear()


@pytest.mark.parametrize("tied", [False, True])
def test_make_hf_dir_writes_a_transformers_checkpoint(tmp_path, tied):
    import transformers

    path = make_hf_dir(tmp_path / "hf", "qwen2", tie_word_embeddings=tied, n_layer=1, seed=4)
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files
    config = json.loads((path / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_key_value_heads"]) == (
        "qwen2",
        64,
        2,
    )
    assert config["tie_word_embeddings"] is tied
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    norm = model.model.layers[0].input_layernorm.weight.detach().numpy()
    bias = model.model.layers[0].self_attn.q_proj.bias.detach().numpy()
    assert norm.std() > 1e-3 and bias.std() > 1e-3  # 1-D parameters are not left constant
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert tok.eos_token == tm.EOT and tok.chat_template == tm.CHATML_TEMPLATE


def test_only_gpt2_style_vocabularies_become_tokenizer_json():
    with pytest.raises(ValueError, match="GPT-2-style"):
        tm.tokenizer_json_from_gguf({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []})

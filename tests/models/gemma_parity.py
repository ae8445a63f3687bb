"""What the Gemma 2 and Gemma 3 parity modules share: transformers as the oracle on the
committed HF folder under ``tests/data/arch/<arch>/``, the logits and greedy tests on every
source and backend, the GGUF checks and the chat-template check against transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
import transformers  # the oracle (in the test extra)

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import read_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.text.chat_template import ChatTemplate

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
ARCH_DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
SOURCES = ("hf", "llama.cpp-gguf", "tessera-gguf")
N_PROMPT, N_PREDICT, TOL = 16, 10, 2e-5


def files(arch: str) -> tuple[Path, Path]:
    """The committed HF folder and llama.cpp's f32 GGUF of ``arch``."""
    return ARCH_DATA / arch / "hf", ARCH_DATA / arch / f"{arch}-f32.gguf"


def load(path: Path, backend_name: str) -> Any:
    return load_model(path, RUNTIME, RUNTIME.create_backend(backend_name, dtype="f32"))


def parity_tests(arch: str) -> tuple[Any, Any, Any]:
    """The module-scoped ``oracle`` fixture (transformers' logits of every row of a random
    prompt and its greedy continuation, and the three model files) and the two tests on
    it, to assign to those three names: tessera's logits on each source and backend are
    within ``TOL`` of transformers', and its greedy continuation, prefilled in ubatches of
    5 (the window read across ubatches from the KV cache), is transformers' generate."""
    hf_dir, llama_cpp_gguf = files(arch)

    @pytest.fixture(scope="module", name="oracle")
    def oracle(tmp_path_factory: Any) -> dict[str, Any]:
        converted = convert_hf_to_gguf(
            hf_dir, tmp_path_factory.mktemp(arch) / "t.gguf", RUNTIME, "f32"
        )
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        model.generation_config.eos_token_id = None  # generate all N_PREDICT tokens
        prompt = np.random.default_rng(5).integers(0, model.config.vocab_size, N_PROMPT)
        ids = torch.tensor(prompt)[None]
        with torch.no_grad():
            logits = model(ids).logits[0].numpy()
            out = model.generate(ids, max_new_tokens=N_PREDICT, do_sample=False, pad_token_id=0)
        sources = {"hf": hf_dir, "llama.cpp-gguf": llama_cpp_gguf, "tessera-gguf": converted}
        return {
            "files": sources,
            "prompt": prompt,
            "logits": logits,
            "greedy": out[0, N_PROMPT:].tolist(),
        }

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("source", SOURCES)
    def test_logits_of_every_prompt_row_match_transformers(
        oracle: dict[str, Any], source: str, backend: str
    ) -> None:
        model = load(oracle["files"][source], backend)
        assert model.config.arch == arch
        ctx = Context(model, ContextParams(n_ctx=64))
        logits = ctx.decode(Batch.for_sequence(oracle["prompt"], logits="all"))
        assert logits.shape == oracle["logits"].shape
        assert np.abs(logits - oracle["logits"]).max() < TOL

    @pytest.mark.parametrize("backend", BACKENDS)
    @pytest.mark.parametrize("source", SOURCES)
    def test_greedy_continuation_matches_transformers_generate(
        oracle: dict[str, Any], source: str, backend: str
    ) -> None:
        ctx = Context(load(oracle["files"][source], backend), ContextParams(n_ctx=64, n_ubatch=5))
        sampler = Sampler(SamplerParams(temperature=0))
        tokens = list(generate(ctx, oracle["prompt"].tolist(), N_PREDICT, sampler))
        assert tokens == oracle["greedy"]

    return (
        oracle,
        test_logits_of_every_prompt_row_match_transformers,
        test_greedy_continuation_matches_transformers_generate,
    )


def check_ggufs_read_as_the_folder(arch: str, tessera_gguf: Path) -> tuple[Any, Any]:
    """llama.cpp's GGUF and tessera's read as the folder's config, and hold the same
    tensors bit for bit (names, layout and Gemma's ``1 + w`` norms); returns both files
    (llama.cpp's first) for the family's own metadata checks."""
    hf_dir, llama_cpp_gguf = files(arch)
    architecture = RUNTIME.architecture(arch)
    hf_config = architecture.config_from_hf(json.loads((hf_dir / "config.json").read_text()))
    theirs, ours = read_gguf(llama_cpp_gguf), read_gguf(tessera_gguf)
    for gguf in (theirs, ours):
        shapes = {n: t.shape for n, t in gguf.tensors.items()}
        config = architecture.config_from_gguf(gguf.metadata, shapes)
        assert config.rms_eps == pytest.approx(hf_config.rms_eps)  # GGUF stores it as f32
        assert attrs.evolve(config, rms_eps=hf_config.rms_eps) == hf_config
    assert set(ours.tensors) == set(theirs.tensors)
    for name, tensor in theirs.tensors.items():
        assert ours.tensors[name].shape == tensor.shape, name
        assert np.array_equal(ours.tensors[name].data, tensor.data), name
    return theirs, ours


def check_chat_template(arch: str, messages: list, add_generation_prompt: bool) -> None:
    """The GGUF's chat template renders ``messages`` as transformers renders the folder's."""
    _, llama_cpp_gguf = files(arch)
    tok = load(llama_cpp_gguf, "numpy").tokenizer
    bos, eos = tok.token_to_piece(tok.bos_id), tok.token_to_piece(tok.eos_id)
    assert (bos, eos) == ("<bos>", "<eos>")
    ours = ChatTemplate(tok.chat_template, bos, eos)
    want = hf_tokenizer(arch, bos, eos).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(messages, add_generation_prompt=add_generation_prompt) == want
    assert want.startswith("<bos><start_of_turn>user\n")


def gguf_template(arch: str) -> ChatTemplate:
    """The chat template of llama.cpp's GGUF of ``arch``."""
    return ChatTemplate(load(files(arch)[1], "numpy").tokenizer.chat_template, "<bos>", "<eos>")


def hf_tokenizer(arch: str, bos: str, eos: str) -> Any:
    """A transformers tokenizer carrying the folder's chat template (its SentencePiece model
    needs the sentencepiece package to load, and templates render text only)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    config = json.loads((files(arch)[0] / "tokenizer_config.json").read_text())
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        chat_template=config["chat_template"],
        bos_token=bos,
        eos_token=eos,
    )

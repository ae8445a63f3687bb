"""The shipped draft model and MTP head of the bundled default model: they load, match its
vocabulary, give the plain greedy output and are accepted often (they were trained)."""

from __future__ import annotations

import pytest

from tessera.contract.spec import SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

HERE = default_model_path().parent
MTP = HERE / "tessera-default-mtp.gguf"
DRAFT = HERE / "tessera-default-draft.gguf"


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def test_mtp_variant_holds_the_default_model_unchanged():
    plain, mtp = read_gguf(default_model_path()), read_gguf(MTP)
    assert mtp.metadata["llama.nextn_predict_layers"] == 1
    assert mtp.metadata["llama.block_count"] == plain.metadata["llama.block_count"] + 1
    for name, t in plain.tensors.items():
        assert bytes(mtp.tensors[name].data) == bytes(t.data), name
    assert mtp.metadata["tokenizer.ggml.tokens"] == plain.metadata["tokenizer.ggml.tokens"]
    assert read_gguf(DRAFT).metadata["tokenizer.ggml.tokens"] == list(
        plain.metadata["tokenizer.ggml.tokens"]
    )


@pytest.mark.parametrize("spec_type", ["draft", "mtp"])
def test_trained_drafters_are_lossless_and_accepted(spec_type, runtime):
    model = load_model(MTP, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=128))
    prompt = model.tokenizer.encode("The for statement", add_special=True)
    greedy = SamplerParams(temperature=0.0)
    want = list(generate(ctx, prompt, 40, Sampler(greedy)))
    params = SpecParams(model_draft=str(DRAFT), draft_max=4, p_min=0.0)
    decoder = create_decoder(runtime, spec_type, ctx, params)
    stats = GenerationStats()
    got = list(
        generate(ctx, prompt, 40, Sampler(greedy), decoder=decoder, spec=params, stats=stats)
    )
    decoder.close()
    assert got == want
    # random heads are accepted ~1/4096 of the time; the trained ones far more often
    assert stats.acceptance_rate > 0.2, stats.as_dict()

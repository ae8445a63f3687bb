"""tessera.LLM's constructor takes llama-cpp-python's ``Llama`` names where tessera has the
meaning (model_path, n_ctx, n_batch, n_threads, seed, verbose, n_gpu_layers, flash_attn);
anything else is a TypeError naming it."""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.errors import TesseraError
from tessera.files.load import default_model_path
from tessera.llm_options import load_options

PROMPT = "The for statement"


def test_llama_cpp_python_names_reach_the_context():
    with tessera.LLM(
        model_path=default_model_path(),
        backend="numpy",
        n_ctx=128,
        n_batch=32,
        n_threads=None,
        flash_attn=False,
        n_gpu_layers=0,
        verbose=False,
    ) as llm:
        assert llm.model_name == default_model_path().name
        assert (llm.n_ctx, llm.context_params.n_batch) == (128, 32)
        assert llm.context_params.flash_attn == "off"
        assert llm.complete(PROMPT, max_tokens=3, temperature=0)["usage"]["completion_tokens"]


def test_model_and_model_path_together_are_refused():
    with pytest.raises(TesseraError, match="both model and model_path"):
        load_options("a.gguf", None, {"model_path": "b.gguf"})


def test_the_constructor_seed_draws_each_calls_seed():
    draws = np.random.default_rng(7)
    first, second = (int(draws.integers(0, 2**63)) for _ in range(2))
    kw = {"max_tokens": 12, "temperature": 1.0}
    with tessera.LLM(backend="numpy", seed=7) as seeded, tessera.LLM(backend="numpy") as plain:
        got = [seeded.complete(PROMPT, **kw)["choices"][0]["text"] for _ in range(2)]
        want = [plain.complete(PROMPT, seed=s, **kw)["choices"][0]["text"] for s in (first, second)]
        assert got == want
        # a call's own seed wins over the constructor's
        own = seeded.complete(PROMPT, seed=first, **kw)["choices"][0]["text"]
        assert own == want[0]


@pytest.mark.parametrize("seed", [None, -1, 0xFFFFFFFF])
def test_llama_cpp_pythons_random_seeds_leave_calls_random(seed):
    assert load_options(None, None, {"seed": seed}).seeds is None


def test_a_bad_seed_is_one_clear_error():
    with pytest.raises(TesseraError, match="seed must be a non-negative integer"):
        load_options(None, None, {"seed": "7"})


def test_verbose_false_loads_without_a_progress_bar():
    assert load_options(None, None, {}).progress is True
    assert load_options(None, None, {"verbose": False}).progress is False


@pytest.mark.parametrize("n", [0, -1])
def test_n_gpu_layers_none_or_all_is_taken(n):
    assert load_options(None, "cpu", {"n_gpu_layers": n}).model is None


def test_a_partial_offload_is_refused_with_the_way_out():
    with pytest.raises(TesseraError, match="n_gpu_layers=10 would split.*give 0 or -1"):
        load_options(None, None, {"n_gpu_layers": 10})
    with pytest.raises(TesseraError, match="n_gpu_layers=0 keeps every layer on the CPU"):
        load_options(None, "cuda", {"n_gpu_layers": 0})
    assert load_options(None, "cuda", {"n_gpu_layers": -1}).context == {}


def test_unknown_options_are_a_type_error_naming_each():
    with pytest.raises(TypeError, match="unknown option.*chat_format, rope_freq_base; it takes"):
        load_options(None, None, {"rope_freq_base": 1e4, "chat_format": "chatml"})

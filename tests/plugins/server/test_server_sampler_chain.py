"""Each later stage of the sampler chain (typical_p, top_n_sigma, xtc_*, repeat_last_n,
presence and frequency penalties) changes what the server samples exactly as the same
stage does in the in-process generator, through the official openai client, httpx on
llama-server's /completion and the ollama client's options (top_p too); and the same
settings given as server flags (--temp, -s, --top-k, --top-p, --min-p, --typical) are
what a request that sets none samples with.

The oracle is the single-sequence generator with a seeded :class:`Sampler` of the same
settings (the stages' formulas are checked in tests/core/engine/test_sampler_chain.py);
each case also checks that the stage changes the text, so the comparison can fail.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.plugins.server.testing import live_server

PROMPT = "Once upon a time"
COUNTING = "1, 2, 3, 4, 5, 6,"
N = 16
#: Seeded sampling at temperature 1 over the whole vocabulary: every stage has choices to cut.
BASE = dict(temperature=1.0, seed=7, top_k=0, top_p=1.0, min_p=0.0)


def reference(server, prompt: str, **settings) -> str:
    """The text of the in-process generator sampling with ``settings``."""
    model = server.model.model
    tok = model.tokenizer
    ctx = Context(model, ContextParams(n_ctx=512))
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    sampler = Sampler(SamplerParams(**settings))
    return tok.decode(list(generate(ctx, ids, N, sampler, eog_ids=tok.eog_ids)))


STAGES = [
    pytest.param(PROMPT, dict(typical_p=0.3), id="typical_p"),
    pytest.param(PROMPT, dict(top_n_sigma=0.5), id="top_n_sigma"),
    pytest.param(PROMPT, dict(xtc_probability=1.0, xtc_threshold=0.01), id="xtc"),
    pytest.param(COUNTING, dict(repeat_penalty=3.0, repeat_last_n=4), id="repeat_last_n"),
    pytest.param(COUNTING, dict(presence_penalty=2.0, frequency_penalty=1.0), id="penalties"),
]


@pytest.mark.parametrize("prompt, stage", STAGES)
def test_a_stage_on_the_openai_route_samples_as_the_reference(client, server, prompt, stage):
    want = reference(server, prompt, **BASE, **stage)
    if "repeat_last_n" in stage:  # against the same penalty over the default window
        other = reference(server, prompt, **BASE, repeat_penalty=stage["repeat_penalty"])
    else:
        other = reference(server, prompt, **BASE)
    assert want != other, "the stage does not change this text: the test could not fail"
    kw = {k: v for k, v in {**BASE, **stage}.items() if k in ("temperature", "seed", "top_p")}
    kw |= {k: v for k, v in stage.items() if k in ("presence_penalty", "frequency_penalty")}
    extra = {k: v for k, v in {**BASE, **stage}.items() if k not in kw}
    r = client.completions.create(model="m", prompt=prompt, max_tokens=N, **kw, extra_body=extra)
    assert r.choices[0].text == want


@pytest.mark.parametrize("prompt, stage", STAGES)
def test_a_stage_on_llama_servers_completion_samples_as_the_reference(server, prompt, stage):
    body = {"prompt": prompt, "n_predict": N, **BASE, **stage}
    r = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    assert r["content"] == reference(server, prompt, **BASE, **stage)
    for name, value in stage.items():
        assert r["generation_settings"][name] == value, name


#: Server-wide defaults by flag (llama-server's names): a request that sets none samples so.
FLAG_SETTINGS = dict(temperature=1.0, seed=5, top_k=40, top_p=0.9, min_p=0.02, typical_p=0.6)
FLAGS = ["--temp", "1", "-s", "5", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.02"]
FLAGS += ["--typical", "0.6", "-n", str(N)]


@pytest.fixture(scope="module")
def flagged():
    with live_server(["--backend", "numpy", "-np", "1", "-c", "512", *FLAGS]) as srv:
        yield srv


def test_a_request_that_sets_nothing_samples_with_the_server_flags(flagged):
    want = reference(flagged, PROMPT, **FLAG_SETTINGS)
    assert want != reference(flagged, PROMPT, **{**FLAG_SETTINGS, "seed": 6})
    assert want != reference(flagged, PROMPT, **{**FLAG_SETTINGS, "typical_p": 1.0})
    client = openai.OpenAI(base_url=flagged.v1, api_key="x", max_retries=0, timeout=120)
    assert client.completions.create(model="m", prompt=PROMPT).choices[0].text == want
    native = httpx.post(flagged.url + "/completion", json={"prompt": PROMPT}, timeout=120).json()
    assert native["content"] == want
    params = httpx.get(flagged.url + "/props", timeout=60).json()
    params = params["default_generation_settings"]["params"]
    for name, value in FLAG_SETTINGS.items():
        assert params[name] == pytest.approx(value), name


OLLAMA_STAGES = [
    pytest.param(PROMPT, dict(top_p=0.5), id="top_p"),
    pytest.param(PROMPT, dict(typical_p=0.3), id="typical_p"),
    pytest.param(COUNTING, dict(repeat_penalty=3.0, repeat_last_n=4), id="repeat_last_n"),
    pytest.param(COUNTING, dict(presence_penalty=2.0, frequency_penalty=1.0), id="penalties"),
]


@pytest.mark.parametrize("prompt, stage", OLLAMA_STAGES)
def test_an_ollama_option_samples_as_the_reference(server, prompt, stage):
    import ollama

    options = {**BASE, **stage, "num_predict": N}
    out = ollama.Client(host=server.url, timeout=120).generate(
        model="m", prompt=prompt, raw=True, options=options
    )
    want = reference(server, prompt, **{**BASE, **stage})
    assert out.response == want
    # the same without the stage (repeat_last_n: with the penalty over the default window)
    kept = {k: v for k, v in stage.items() if k == "repeat_penalty"}
    assert want != reference(server, prompt, **{**BASE, **kept})

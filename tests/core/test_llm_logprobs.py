"""tessera.LLM's logprobs: complete's ``logprobs=N`` and chat's ``logprobs`` /
``top_logprobs`` are the live server's for the same request and seed, a numpy log-softmax
of the logits the engine's sampler saw, the same streamed as whole, and validate as the
``openai`` package's types."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

import tessera
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import TesseraError
from tessera.plugins.server.testing import live_server

PROMPT = "1, 2, 3, 4, 5, 6,"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def llm():
    with tessera.LLM(backend="numpy", n_ctx=256) as model:
        yield model


@pytest.fixture(scope="module")
def server():
    with live_server(["--backend", "numpy", "-np", "1", "-c", "256", "-b", "64"]) as srv:
        yield srv


def _post(server, route: str, body: dict) -> dict:
    response = httpx.post(server.url + route, json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _close(got, want):
    """Equal structures, floats within 1e-4 (two runs may batch the prompt differently)."""
    if isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            _close(got[key], want[key])
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _close(g, w)
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4)
    else:
        assert got == want


def test_complete_logprobs_are_the_servers(llm, server):
    ids = llm.tokenize(PROMPT)
    kw = {"max_tokens": 8, "temperature": 0.9, "seed": 21, "logprobs": 3}
    got = llm.complete(ids, logit_bias={11: 2.5}, **kw)
    want = _post(server, "/v1/completions", {"prompt": ids, "logit_bias": {"11": 2.5}, **kw})
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    logprobs = got["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == got["usage"]["completion_tokens"] == 8
    assert all(len(top) == 3 for top in logprobs["top_logprobs"])
    _close(logprobs, want["choices"][0]["logprobs"])
    Completion.model_validate(got)


def test_chat_logprobs_are_the_servers(llm, server):
    kw = {"max_tokens": 6, "temperature": 0.7, "seed": 4, "logprobs": True, "top_logprobs": 2}
    got = llm.chat(MESSAGES, **kw)
    want = _post(server, "/v1/chat/completions", {"messages": MESSAGES, **kw})
    content = got["choices"][0]["logprobs"]["content"]
    assert len(content) == got["usage"]["completion_tokens"]
    assert [len(e["top_logprobs"]) for e in content] == [2] * len(content)
    _close(got["choices"][0]["logprobs"], want["choices"][0]["logprobs"])
    ChatCompletion.model_validate(got)
    # without top_logprobs the entries have no alternatives, as the server's
    bare = llm.chat(MESSAGES, max_tokens=2, temperature=0, logprobs=True)
    assert [e["top_logprobs"] for e in bare["choices"][0]["logprobs"]["content"]] == [[], []]


class _Recording(Sampler):
    """The engine's sampler, keeping every row of logits it was given."""

    def __init__(self, params: SamplerParams) -> None:
        super().__init__(params)
        self.rows: list[np.ndarray] = []

    def sample(self, logits, history=()):
        self.rows.append(np.array(logits, dtype=np.float64))
        return super().sample(logits, history)


def test_logprobs_are_a_log_softmax_of_the_logits_the_sampler_saw(llm):
    ids = llm.tokenize(PROMPT)
    got = llm.complete(ids, max_tokens=6, temperature=0.8, seed=9, logprobs=4)
    logprobs = got["choices"][0]["logprobs"]
    sampler = _Recording(SamplerParams(temperature=0.8, seed=9))
    ctx = Context(llm.model, ContextParams(n_ctx=llm.n_ctx))
    tok = llm.model.tokenizer
    drawn = list(generate(ctx, ids, 6, sampler, eog_ids=tok.eog_ids))
    assert logprobs["tokens"] == [tok.token_to_piece(t) for t in drawn]
    for row, token, lp, top in zip(
        sampler.rows, drawn, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        oracle = row - row.max() - np.log(np.sum(np.exp(row - row.max())))
        assert lp == pytest.approx(oracle[token], abs=1e-5)
        best = np.argsort(-oracle)[:4]
        assert list(top) == [tok.token_to_piece(int(t)) for t in best]
        assert list(top.values()) == pytest.approx(oracle[best].tolist(), abs=1e-5)
    offsets = np.cumsum([0] + [len(t) for t in logprobs["tokens"][:-1]]).tolist()
    assert logprobs["text_offset"] == offsets


def test_streamed_logprobs_are_the_whole_answers(llm):
    kw = {"max_tokens": 8, "temperature": 0.9, "seed": 13}
    whole = llm.chat(MESSAGES, logprobs=True, top_logprobs=1, **kw)
    chunks = list(llm.stream(MESSAGES, logprobs=True, top_logprobs=1, **kw))
    entries = [
        e
        for c in chunks
        if c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    # the second call reads its prompt from the cache: the logits agree to float32 rounding
    _close(entries, whole["choices"][0]["logprobs"]["content"])
    whole = llm.complete(PROMPT, logprobs=2, **kw)["choices"][0]["logprobs"]
    parts = [c["choices"][0]["logprobs"] for c in llm.stream(PROMPT, logprobs=2, **kw)]
    parts = [p for p in parts if p is not None]
    joined = {k: [v for p in parts for v in p[k]] for k in whole}
    _close(joined, whole)


def test_without_logprobs_there_are_none(llm):
    assert llm.complete(PROMPT, max_tokens=2)["choices"][0]["logprobs"] is None
    assert llm.chat(MESSAGES, max_tokens=2, logprobs=False)["choices"][0]["logprobs"] is None


@pytest.mark.parametrize(
    ("method", "kw", "message"),
    [
        ("complete", {"logprobs": 21}, "logprobs must be an integer from 0 to 20"),
        ("complete", {"top_logprobs": 2}, "complete takes logprobs=N"),
        ("chat", {"top_logprobs": 2}, "top_logprobs needs logprobs=True"),
        ("chat", {"logprobs": 3}, "chat's logprobs is True or False"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs must be an integer"),
    ],
)
def test_bad_logprobs_are_one_clear_error(llm, method, kw, message):
    prompt = PROMPT if method == "complete" else MESSAGES
    with pytest.raises(TesseraError, match=message):
        getattr(llm, method)(prompt, max_tokens=1, **kw)

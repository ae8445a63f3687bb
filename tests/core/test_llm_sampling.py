"""tessera.LLM's sampling keywords: every setting of the sampler chain, logit_bias, stop,
grammar and response_format give the tokens the server's slot engine gives for the same
request and seed (the server is the oracle), and the engine's own generate where the
settings are the sampler's alone."""

from __future__ import annotations

import json

import attrs
import httpx
import pytest

import tessera
from tessera.engine.context import Context, ContextParams
from tessera.engine.dry import DryBreakers
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParamError, SamplerParams
from tessera.errors import TesseraError
from tessera.llm_sampling import KEYWORDS, SAMPLER_KEYWORDS
from tessera.plugins.server.testing import live_server

PROMPT = "1, 2, 3, 4, 5, 6,"
#: Every setting of the sampler chain away from its default (so each one is exercised).
CHAIN = dict(
    temperature=0.9,
    top_k=30,
    top_p=0.9,
    min_p=0.02,
    typical_p=0.95,
    repeat_penalty=1.1,
    repeat_last_n=32,
    presence_penalty=0.3,
    frequency_penalty=0.2,
    top_n_sigma=2.5,
    xtc_probability=0.5,
    xtc_threshold=0.2,
    dry_multiplier=0.8,
    dry_base=1.5,
    dry_allowed_length=2,
    dry_penalty_last_n=48,
    dry_sequence_breakers=["\n", ","],
)


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


def test_every_sampler_field_is_a_keyword():
    fields = {a.name for a in attrs.fields(SamplerParams)} - {"dry_breakers"}
    assert set(SAMPLER_KEYWORDS) == fields
    others = {"max_tokens", "stop", "logit_bias", "grammar", "response_format", "logprobs"}
    assert others | {"top_logprobs"} <= set(KEYWORDS)


def test_the_whole_chain_is_the_engines_sampler_with_the_same_seed(llm):
    got = llm.complete(PROMPT, max_tokens=20, seed=77, **CHAIN)
    tok = llm.model.tokenizer
    params = SamplerParams(**CHAIN, seed=77)
    params = params.with_vocabulary(tok)
    assert isinstance(params.dry_breakers, DryBreakers)
    ctx = Context(llm.model, ContextParams(n_ctx=llm.n_ctx))
    ids = list(generate(ctx, tok.encode(PROMPT), 20, Sampler(params), eog_ids=tok.eog_ids))
    assert got["choices"][0]["text"] == tok.decode(ids)


def test_the_whole_chain_is_the_servers_with_the_same_seed(llm, server):
    ids = llm.tokenize(PROMPT)
    got = llm.complete(ids, max_tokens=20, seed=5, **CHAIN)
    body = {"prompt": ids, "max_tokens": 20, "seed": 5, **CHAIN}
    want = _post(server, "/v1/completions", body)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["usage"] == {k: want["usage"][k] for k in got["usage"]}


def test_logit_bias_is_the_servers(llm, server):
    ids = llm.tokenize(PROMPT)
    greedy = llm.complete(ids, max_tokens=1, temperature=0)["choices"][0]["text"]
    first = llm.tokenize(greedy, add_special=False)[0]
    bias = {first: -100, 11: 5.5}  # llama-cpp-python's int keys ...
    got = llm.complete(ids, max_tokens=8, temperature=0, logit_bias=bias)
    text = got["choices"][0]["text"]
    assert not text.startswith(greedy)  # the banned token is not drawn
    body = {"prompt": ids, "max_tokens": 8, "temperature": 0}
    want = _post(server, "/v1/completions", {**body, "logit_bias": {str(first): -100, "11": 5.5}})
    assert text == want["choices"][0]["text"]
    # ... and OpenAI's string keys
    again = llm.complete(ids, max_tokens=8, temperature=0, logit_bias={str(first): -100, "11": 5.5})
    assert again["choices"][0]["text"] == text


def test_a_grammar_keeps_the_completion_inside_it_as_the_server_does(llm, server):
    grammar = 'root ::= ("yes" | "no") " because " [a-z]+ "."'
    ids = llm.tokenize("Is the sky blue?")
    got = llm.complete(ids, max_tokens=40, temperature=0.7, seed=3, grammar=grammar)
    text = got["choices"][0]["text"]
    assert text.split(" because ")[0] in ("yes", "no") and text.endswith(".")
    assert got["choices"][0]["finish_reason"] == "stop"
    body = {"prompt": ids, "max_tokens": 40, "temperature": 0.7, "seed": 3, "grammar": grammar}
    assert text == _post(server, "/v1/completions", body)["choices"][0]["text"]


def test_response_format_json_is_the_servers_chat_answer(llm, server):
    messages = [{"role": "user", "content": "Give a JSON object with a name."}]
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "person",
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}},
                "required": ["name"],
                "additionalProperties": False,
            },
        },
    }
    got = llm.chat(messages, max_tokens=60, temperature=0, response_format=fmt)
    content = got["choices"][0]["message"]["content"]
    assert set(json.loads(content)) == {"name"}
    body = {"messages": messages, "max_tokens": 60, "temperature": 0, "response_format": fmt}
    want = _post(server, "/v1/chat/completions", body)
    assert content == want["choices"][0]["message"]["content"]
    # llama-cpp-python's form: a json_object with a schema
    lcp = {"type": "json_object", "schema": fmt["json_schema"]["schema"]}
    again = llm.chat(messages, max_tokens=60, temperature=0, response_format=lcp)
    assert again["choices"][0]["message"]["content"] == content
    # any JSON object, sampled
    plain = {"type": "json_object"}
    kw = {"max_tokens": 24, "temperature": 0.8, "seed": 11}
    got = llm.chat(messages, response_format=plain, **kw)["choices"][0]["message"]["content"]
    body = {"messages": messages, "response_format": plain, **kw}
    want = _post(server, "/v1/chat/completions", body)
    assert got.lstrip().startswith("{") and got == want["choices"][0]["message"]["content"]


def test_stream_takes_the_same_keywords(llm):
    kw = dict(max_tokens=10, seed=9, **CHAIN)
    joined = "".join(c["choices"][0]["text"] for c in llm.stream(PROMPT, **kw))
    assert joined == llm.complete(PROMPT, **kw)["choices"][0]["text"]


@pytest.mark.parametrize("method", ["complete", "chat", "stream"])
def test_an_unknown_keyword_is_a_type_error_naming_it(llm, method):
    prompt = [{"role": "user", "content": "hi"}] if method == "chat" else PROMPT
    with pytest.raises(TypeError, match="unexpected keyword argument.*'temprature'"):
        getattr(llm, method)(prompt, max_tokens=2, temprature=0.5)


LCP_OFF = dict(
    suffix=None, echo=False, logprobs=None, tfs_z=1.0, mirostat_mode=0, mirostat_tau=5.0,
    mirostat_eta=0.1, model=None, stopping_criteria=None, logits_processor=None,
)  # fmt: skip


def test_llama_cpp_python_keywords_at_their_off_values_change_nothing(llm):
    kw = dict(max_tokens=10, seed=4, temperature=0.8)
    assert (
        llm.complete(PROMPT, **kw, **LCP_OFF)["choices"][0]["text"]
        == llm.complete(PROMPT, **kw)["choices"][0]["text"]
    )
    messages = [{"role": "user", "content": "hi"}]
    got = llm.chat(messages, **kw, logprobs=False, top_logprobs=None, tools=None)
    assert got["choices"][0]["message"] == llm.chat(messages, **kw)["choices"][0]["message"]


@pytest.mark.parametrize(
    "kw", [{"mirostat_mode": 2}, {"tfs_z": 0.9}, {"echo": True}, {"tools": []}]
)
def test_a_llama_cpp_python_stage_tessera_lacks_is_refused_by_name(llm, kw):
    (name,) = kw
    with pytest.raises(TypeError, match=f"cannot take {name}="):
        llm.complete(PROMPT, max_tokens=2, **kw)


@pytest.mark.parametrize(
    ("method", "kw", "way_out"),
    [
        ("complete", {"tools": [{"type": "function"}]}, "tools belong to a chat; call "
         "LLM.chat(messages, tools=...) instead"),
        ("complete", {"tool_choice": "auto"}, "a tool choice belongs to a chat; call "
         "LLM.chat(messages, tools=..., tool_choice=...) instead"),
        ("chat", {"functions": [{"name": "f"}]}, "functions is the deprecated form of tools; "
         "call LLM.chat(messages, tools=...) instead"),
        ("chat", {"function_call": "auto"}, "function_call is the deprecated form of "
         "tool_choice; call LLM.chat(messages, tools=..., tool_choice=...) instead"),
    ],
)  # fmt: skip
def test_tools_outside_a_chat_are_refused_with_the_chat_call_to_make(llm, method, kw, way_out):
    (name,) = kw
    prompt = PROMPT if method == "complete" else [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError) as err:
        getattr(llm, method)(prompt, max_tokens=2, **kw)
    assert str(err.value) == f"LLM.{method}() cannot take {name}={kw[name]!r}: {way_out}"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"top_p": 2.0}, "top_p must be a finite number between 0 and 1"),
        ({"xtc_probability": -1.0}, "xtc_probability"),
        ({"logit_bias": {10**9: 1.0}}, "logit_bias must map token ids"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a dict"),
        ({"grammar": 'root ::= "a'}, "grammar is refused"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "one output"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)
def test_bad_values_are_one_clear_error(llm, kw, message):
    with pytest.raises(TesseraError, match=message):
        llm.complete(PROMPT, max_tokens=2, **kw)


def test_a_range_error_names_its_field(llm):
    with pytest.raises(SamplerParamError) as info:
        llm.chat([{"role": "user", "content": "hi"}], top_k=1.5)
    assert info.value.field == "top_k"


def test_without_the_grammar_plugin_a_grammar_says_it_cannot_be_enforced(monkeypatch):
    monkeypatch.setenv("TESSERA_DISABLE_PLUGINS", "grammar")
    with tessera.LLM(backend="numpy", n_ctx=64) as bare:
        with pytest.raises(TesseraError, match="grammar cannot be enforced"):
            bare.complete(PROMPT, grammar='root ::= "a"')

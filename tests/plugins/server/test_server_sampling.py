"""Sampling fields, the server-wide defaults of `tessera serve` flags, content parts, echo
and the context-overflow error, through the official openai and ollama clients and httpx.

The oracle of a greedy answer is the single-sequence generator run in-process with the
same sampler settings (whose stages tests/core/engine/test_sampler_chain.py checks
against the formulas).
"""

from __future__ import annotations

import attrs
import httpx
import openai
import pytest

from tessera.engine.context import Context, ContextParams
from tessera.engine.dry import DryBreakers
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.plugins.server.testing import live_server

PROMPT = "Once upon a time"
#: A prompt whose greedy continuation repeats itself (" 3, 3, 3, ..."), so penalties and
#: DRY change it.
COUNTING = "1, 2, 3, 4, 5, 6,"
#: The flags the module's server starts with: requests that set nothing get these.
FLAGS = dict(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5, repeat_penalty=1.2)


@pytest.fixture(scope="module")
def server():
    argv = ["--backend", "numpy", "-np", "2", "-c", "256", "-b", "64", "--temp", "0"]
    argv += ["--frequency-penalty", "1.5", "--presence-penalty", "0.5"]
    argv += ["--repeat-penalty", "1.2", "-n", "10"]
    with live_server(argv) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def reference(server, prompt: str, n: int, **settings) -> str:
    """The greedy text of the in-process generator with ``settings``."""
    model = server.model.model
    tok = model.tokenizer
    params = SamplerParams(**{"temperature": 0.0, **settings})
    if params.dry_multiplier:
        pieces = [tok.token_to_piece(i) for i in range(tok.n_vocab)]
        breakers = DryBreakers.from_strings(
            params.dry_sequence_breakers, pieces, lambda s: tok.encode(s, add_special=False)
        )
        params = attrs.evolve(params, dry_breakers=breakers)
    ctx = Context(model, ContextParams(n_ctx=256))
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    return tok.decode(list(generate(ctx, ids, n, Sampler(params), eog_ids=tok.eog_ids)))


def test_a_request_without_sampling_fields_gets_the_server_flags(client, server):
    r = client.completions.create(model="m", prompt=COUNTING)
    assert r.choices[0].text == reference(server, COUNTING, 10, **FLAGS)
    assert r.usage.completion_tokens == 10 or r.choices[0].finish_reason == "stop"


def test_a_request_field_overrides_the_flag(client, server):
    r = client.completions.create(
        model="m",
        prompt=COUNTING,
        max_tokens=10,
        frequency_penalty=0,
        presence_penalty=0,
        extra_body={"repeat_penalty": 1},
    )
    assert r.choices[0].text == reference(server, COUNTING, 10)
    # the penalties change this model's greedy text, so the comparison above can fail
    assert r.choices[0].text != reference(server, COUNTING, 10, **FLAGS)


def test_props_default_generation_settings_show_the_flags(server):
    settings = httpx.get(server.url + "/props", timeout=120).json()["default_generation_settings"]
    params = settings["params"]
    assert params["temperature"] == 0
    assert params["frequency_penalty"] == 1.5 and params["presence_penalty"] == 0.5
    assert params["repeat_penalty"] == pytest.approx(1.2)
    assert params["n_predict"] == 10
    assert params["dry_sequence_breakers"] == ["\n", ":", '"', "*"]
    assert params["samplers"] == [
        "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
        "temperature",
    ]  # fmt: skip


def test_dry_matches_the_reference(client, server):
    dry = dict(dry_multiplier=2.0, dry_base=1.5, dry_allowed_length=1, dry_penalty_last_n=-1)
    plain = dict(frequency_penalty=0, presence_penalty=0)
    r = client.completions.create(
        model="m", prompt=COUNTING, max_tokens=12, **plain, extra_body={"repeat_penalty": 1, **dry}
    )
    want = reference(server, COUNTING, 12, **dry)
    assert r.choices[0].text == want
    assert want != reference(server, COUNTING, 12)  # DRY breaks " 3, 3, 3"


def test_native_completion_takes_llama_server_fields(server):
    fields = dict(typical_p=0.5, top_n_sigma=1.0, xtc_probability=0.5, xtc_threshold=0.2)
    fields |= dict(dry_multiplier=0.8, dry_sequence_breakers=["\n"], frequency_penalty=0.0)
    body = {"prompt": PROMPT, "n_predict": 6, **fields}
    r = httpx.post(server.url + "/completion", json=body, timeout=120).json()
    settings = r["generation_settings"]
    for name, value in fields.items():
        assert settings[name] == value, name
    assert settings["temperature"] == 0  # the server's --temp
    assert r["tokens_predicted"] == 6 or r["stop_type"] != "limit"


def test_ollama_options_reach_the_sampler(client, server):
    import ollama

    options = dict(repeat_penalty=1.3, presence_penalty=0.7, frequency_penalty=0.2)
    options |= dict(typical_p=0.9, temperature=0, num_predict=8)
    messages = [{"role": "user", "content": "Tell me about the little dog."}]
    got = ollama.Client(host=server.url).chat(model="m", messages=messages, options=options)
    want = client.chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=8,
        temperature=0,
        presence_penalty=0.7,
        frequency_penalty=0.2,
        extra_body=dict(repeat_penalty=1.3, typical_p=0.9),
    )
    assert got.message.content == want.choices[0].message.content


@pytest.mark.parametrize(
    "field, value",
    [
        ("xtc_probability", 1.5),
        ("xtc_threshold", -1),
        ("dry_base", 0.5),
        ("dry_allowed_length", -1),
        ("dry_penalty_last_n", -2),
        ("dry_sequence_breakers", "\n"),
        ("typical_p", "high"),
        ("presence_penalty", "x"),
    ],
)
def test_a_bad_sampling_field_is_400_naming_it(client, server, field, value):
    with pytest.raises(openai.BadRequestError, match=field) as err:
        client.completions.create(model="m", prompt=PROMPT, extra_body={field: value})
    assert err.value.body["param"] == field
    r = httpx.post(server.url + "/completion", json={"prompt": PROMPT, field: value}, timeout=60)
    assert r.status_code == 400 and field in r.json()["error"]["message"]


def test_a_bad_ollama_option_is_400(server):
    import ollama

    with pytest.raises(ollama.ResponseError, match="typical_p") as err:
        ollama.Client(host=server.url).generate(model="m", prompt="hi", options={"typical_p": "x"})
    assert err.value.status_code == 400


def test_echo_puts_the_prompt_before_the_completion(client):
    plain = client.completions.create(model="m", prompt=PROMPT, max_tokens=5)
    echoed = client.completions.create(model="m", prompt=PROMPT, max_tokens=5, echo=True)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    chunks = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=5, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed.choices[0].text
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="m", prompt=PROMPT, echo=True, logprobs=1)


def test_content_parts_are_joined_as_text(client):
    parts = [{"type": "text", "text": "Tell me about"}, {"type": "text", "text": "the dog."}]
    as_parts = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": parts}], max_tokens=6
    )
    as_text = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Tell me about\nthe dog."}], max_tokens=6
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content


@pytest.mark.parametrize(
    "part, kind",
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "vision"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
    ],
)
def test_image_and_audio_parts_are_refused(client, part, kind):
    content = [{"type": "text", "text": "What is this?"}, part]
    with pytest.raises(openai.BadRequestError, match=f"no {kind} encoder"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}])


def test_a_prompt_over_the_context_carries_both_counts(client, server):
    long_prompt = " ".join(["dog"] * 300)
    n = len(server.model.tokenizer.encode(long_prompt))
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt=long_prompt, max_tokens=4)
    body = err.value.body
    assert body["type"] == "exceed_context_size_error"
    assert body["n_prompt_tokens"] == n and body["n_ctx"] == 256
    assert body["code"] == "context_length_exceeded"


def test_an_anthropic_image_block_is_refused(server):
    import anthropic

    ac = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}  # fmt: skip
    content = [{"type": "text", "text": "What is this?"}, image]
    with pytest.raises(anthropic.BadRequestError, match="no vision encoder"):
        ac.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": content}])


def test_ollama_images_are_refused(server):
    import ollama

    oc = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError, match="no vision encoder") as err:
        oc.generate(model="m", prompt="What is this?", images=["AAAA"])
    assert err.value.status_code == 400
    message = {"role": "user", "content": "What is this?", "images": ["AAAA"]}
    with pytest.raises(ollama.ResponseError, match="no vision encoder"):
        oc.chat(model="m", messages=[message])

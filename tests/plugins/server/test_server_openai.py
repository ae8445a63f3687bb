"""The OpenAI API with the official ``openai`` client: completions and chat, streamed and
not, usage, stop strings, seeds, n > 1, logprobs, JSON output, concurrency."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams

MESSAGES = [{"role": "user", "content": "Tell me about the little dog."}]


def _reference_text(server, prompt: str, n: int) -> str:
    """What the single-sequence generator gives greedily (the oracle)."""
    model = server.model.model
    tok = model.tokenizer
    ctx = Context(model, ContextParams(n_ctx=512))
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    out = generate(ctx, ids, n, Sampler(SamplerParams(temperature=0)), eog_ids=tok.eog_ids)
    return tok.decode(list(out))


def test_models_lists_the_model_with_its_context_length(client, server):
    models = client.models.list().data
    assert [m.id for m in models] == ["tessera-default.gguf"]
    assert models[0].context_length == 512


def test_completion_matches_the_reference_generator(client, server):
    r = client.completions.create(
        model="tessera-default.gguf", prompt="Once upon a time", max_tokens=16, temperature=0
    )
    assert r.choices[0].text == _reference_text(server, "Once upon a time", 16)
    assert r.object == "text_completion"
    n_prompt = len(server.model.tokenizer.encode("Once upon a time"))
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.completion_tokens == 16 or r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_streamed_completion_equals_the_whole_one(client):
    kw = dict(model="m", prompt="The little dog", max_tokens=12, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    finals = [f for f in finals if f]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens
    )


def test_chat_streamed_and_whole_agree_and_the_role_comes_first(client):
    kw = dict(model="m", messages=MESSAGES, max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert whole.object == "chat.completion" and chunks[1].object == "chat.completion.chunk"
    # llama-server's timings ride on the choice's last chunk (what the web UI's tok/s reads)
    (last,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert last.timings["predicted_n"] == chunks[-1].usage.completion_tokens
    assert last.timings["predicted_n"] == whole.usage.completion_tokens
    assert last.timings["predicted_per_second"] > 0


def test_max_completion_tokens_is_an_alias(client):
    r = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_completion_tokens=3,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_text_before_it(client, server):
    full = _reference_text(server, "Once upon a time", 24)
    word = full.split()[3]  # a word the model really writes
    r = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=24, temperature=0, stop=[word]
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(word)]
    streamed = client.completions.create(
        model="m",
        prompt="Once upon a time",
        max_tokens=24,
        temperature=0,
        stop=word,
        stream=True,
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_the_same_seed_gives_the_same_text_and_another_seed_another(client):
    kw = dict(model="m", prompt="Once upon a time", max_tokens=24, temperature=1.0)
    texts = [
        client.completions.create(**kw, seed=s, extra_body={"top_k": 0}).choices[0].text
        for s in (7, 7, 8)
    ]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_n_choices_are_distinct_draws_reproducible_by_seed(client):
    kw = dict(model="m", messages=MESSAGES, max_tokens=16, temperature=1.0, n=3, seed=11)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1
    assert 3 <= a.usage.completion_tokens <= 3 * 16  # summed over the choices
    assert a.usage.prompt_tokens == b.usage.prompt_tokens  # the prompt counted once


def test_streamed_n_choices_carry_their_index(client):
    chunks = list(
        client.completions.create(
            model="m", prompt="The sun", max_tokens=8, temperature=0, n=2, stream=True
        )
    )
    by_index = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            by_index[ch.index] += ch.text
    assert by_index[0] == by_index[1]  # greedy: both choices write the same text
    assert by_index[0]


def test_concurrent_requests_get_the_tokens_of_sequential_ones(client):
    prompts = ["Once upon a time", "The little dog", "In the morning", "She said", "A list"]

    def ask(p):
        return client.completions.create(model="m", prompt=p, max_tokens=16, temperature=0)

    sequential = [ask(p).choices[0].text for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:  # 5 clients on 3 slots + a queue of 2
        concurrent = [r.choices[0].text for r in pool.map(ask, prompts)]
    assert concurrent == sequential


def test_logprobs_are_log_probabilities_of_the_chosen_tokens(client):
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
    legacy = client.completions.create(
        model="m", prompt="The sun", max_tokens=4, temperature=0, logprobs=2
    )
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text
    assert all(len(t) == 2 for t in lp.top_logprobs)


def test_json_object_response_format_gives_valid_json(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={"type": "json_object"},
        )
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:  # cut by max_tokens: still a prefix of an object
            assert r.choices[0].message.content.lstrip().startswith("{")


def test_unknown_fields_are_tolerated(client):
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=2, extra_body={"frobnicate": {"x": 1}}
    )
    assert r.choices[0].message.role == "assistant"


def test_logit_bias_bans_and_forces_tokens(client, server):
    tok = server.model.tokenizer
    kw = dict(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
    plain = client.completions.create(**kw, logprobs=0)
    first = tok.encode(plain.choices[0].logprobs.tokens[0], add_special=False)[0]
    banned = client.completions.create(**kw, logit_bias={str(first): -100})
    assert not banned.choices[0].text.startswith(plain.choices[0].logprobs.tokens[0])
    forced_id = tok.encode(" zebra", add_special=False)[0]
    forced = client.completions.create(**kw, logit_bias={str(forced_id): 100})
    assert forced.choices[0].text.startswith(tok.token_to_piece(forced_id))
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(**kw, logit_bias={"-5": 1})

"""POST /completion (and /completions) with plain HTTP: llama-server's field names,
response fields, stream chunks and error shape (its tools/server/tests/unit/
test_completion.py and test_ctx_shift.py), each value checked against tessera's own
OpenAI route for the same request or against the engine's own counters (/slots)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tessera.plugins.server.testing import call

PROMPT = "Once upon a time"
#: Every field of llama-server's final /completion result.
FINAL_FIELDS = {
    "index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted",
    "tokens_evaluated", "generation_settings", "prompt", "has_new_line", "truncated",
    "stop_type", "stopping_word", "tokens_cached", "timings",
}  # fmt: skip
TIMINGS = {
    "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
    "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
}  # fmt: skip


def complete(server, route: str = "/completion", **body):
    answer = call(server.url + route, {"prompt": PROMPT, "temperature": 0, **body})
    assert answer.status == 200, answer.raw
    return answer.json


def openai_text(server, **kw) -> openai.types.Completion:
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    kw = {"temperature": 0, **kw}
    extra = {"top_k": kw.pop("top_k")} if "top_k" in kw else None  # llama.cpp's, not OpenAI's
    return client.completions.create(model="m", prompt=PROMPT, extra_body=extra, **kw)


def n_tokens(server, text: str) -> int:
    return len(server.model.tokenizer.encode(text, add_special=True, parse_special=True))


def test_the_result_has_llama_servers_fields_and_the_openai_routes_text(server):
    r = complete(server, n_predict=8, return_tokens=True, cache_prompt=False)
    assert FINAL_FIELDS <= set(r) and set(r["timings"]) == TIMINGS
    assert r["content"] == openai_text(server, max_tokens=8).choices[0].text
    assert call(server.url + "/detokenize", {"tokens": r["tokens"]}).json["content"] == r["content"]
    assert len(r["tokens"]) == r["tokens_predicted"] == r["timings"]["predicted_n"] == 8
    assert r["tokens_evaluated"] == r["timings"]["prompt_n"] == n_tokens(server, PROMPT)
    assert (r["stop"], r["stop_type"], r["stopping_word"], r["truncated"]) == (
        True, "limit", "", False
    )  # fmt: skip
    assert r["has_new_line"] == ("\n" in r["content"])
    assert r["model"] == call(server.v1 + "/models").json["data"][0]["id"]
    assert r["prompt"] == PROMPT and r["index"] == 0
    settings = r["generation_settings"]
    assert (settings["n_predict"], settings["temperature"], settings["seed"]) == (8, 0, 2**32 - 1)
    assert settings["stream"] is False and settings["n_probs"] == 0
    # what the slot holds: the prompt and every generated token but the last (never evaluated)
    slot = call(server.url + "/slots").json[r["id_slot"]]
    assert r["tokens_cached"] == slot["n_cached_tokens"] == r["tokens_evaluated"] + 7
    # without return_tokens the ids are not sent (llama-server's default)
    assert complete(server, n_predict=2)["tokens"] == []


def test_completions_is_the_native_route_too(server):
    native = complete(server, "/completions", n_predict=6)
    assert native["content"] == complete(server, n_predict=6)["content"]
    assert native["stop"] is True and "choices" not in native


def test_the_stream_sends_one_token_a_chunk_then_the_end_without_done(server):
    whole = complete(server, n_predict=8, return_tokens=True)
    answer = call(server.url + "/completion", {"prompt": PROMPT, "temperature": 0,
                                               "n_predict": 8, "stream": True})  # fmt: skip
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = answer.events
    assert "[DONE]" not in events and all(isinstance(e["stop"], bool) for e in events)
    *chunks, last = events
    assert all(not c["stop"] and len(c["tokens"]) == 1 for c in chunks)
    assert [c["tokens"][0] for c in chunks] == whole["tokens"]
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [c["tokens_predicted"] for c in chunks] == list(range(1, 9))
    assert last["stop"] is True and last["stop_type"] == "limit"
    assert (last["content"], last["tokens"]) == ("", [])  # already sent
    assert last["timings"]["predicted_n"] == 8 and last["generation_settings"]["stream"] is True


def test_n_probs_gives_completion_probabilities_with_the_openai_routes_logprobs(server):
    r = complete(server, n_predict=5, n_probs=10, return_tokens=True)
    probs = r["completion_probabilities"]
    oai = openai_text(server, max_tokens=5, logprobs=10).choices[0].logprobs
    assert [p["id"] for p in probs] == r["tokens"]
    for p, logprob, top in zip(probs, oai.token_logprobs, oai.top_logprobs, strict=True):
        assert math.isclose(p["logprob"], logprob, rel_tol=1e-6) and p["logprob"] <= 0
        assert len(p["top_logprobs"]) == 10 and p["top_logprobs"][0]["id"] == p["id"]  # greedy
        want = list(top.values())  # the second request reuses the cached prompt: f32 rounding
        assert all(
            math.isclose(t["logprob"], w, rel_tol=1e-6)
            for t, w in zip(p["top_logprobs"], want, strict=False)
        )
        assert bytes(p["bytes"]).decode("utf-8", "ignore") == p["token"]
        assert all(t["logprob"] <= 0 and isinstance(t["bytes"], list) for t in p["top_logprobs"])
    streamed = call(server.url + "/completion", {"prompt": PROMPT, "temperature": 0,
                    "n_predict": 5, "n_probs": 10, "stream": True}).events  # fmt: skip
    in_chunks = [c["completion_probabilities"] for c in streamed if not c["stop"]]
    assert [c[0]["id"] for c in in_chunks] == r["tokens"] and all(len(c) == 1 for c in in_chunks)
    assert "completion_probabilities" not in streamed[-1]


def test_prompts_as_ids_a_mix_an_object_or_a_list(server):
    tokens = call(server.url + "/tokenize", {"content": PROMPT, "add_special": True}).json["tokens"]
    text = complete(server, n_predict=6)["content"]
    assert complete(server, prompt=tokens, n_predict=6)["content"] == text
    assert complete(server, prompt={"prompt_string": PROMPT}, n_predict=6)["content"] == text
    both = complete(server, prompt=[tokens, PROMPT], n_predict=6)
    assert isinstance(both, list) and [r["content"] for r in both] == [text, text]
    assert [r["index"] for r in both] == [0, 1]
    # ids and text in one prompt: the text is tokenized in place
    head, tail = PROMPT.split(" ", 1)
    ids = server.model.tokenizer.encode(head, add_special=False)
    mixed = complete(server, prompt=[*ids, " " + tail], n_predict=6, cache_prompt=False)
    expect = ids + server.model.tokenizer.encode(" " + tail, add_special=False)
    assert mixed["tokens_evaluated"] == len(expect)
    assert mixed["content"] == complete(server, prompt=expect, n_predict=6)["content"]


def test_a_stop_string_ends_with_stop_type_word(server):
    text = complete(server, n_predict=12)["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    r = complete(server, n_predict=12, stop=[stop], n_probs=1)
    assert r["stop_type"] == "word" and r["stopping_word"] == stop
    assert r["content"] == text[: text.index(stop)]
    assert r["content"] == openai_text(server, max_tokens=12, stop=[stop]).choices[0].text
    # the stop string's own tokens leave completion_probabilities
    n_stop = len(server.model.tokenizer.encode(stop, add_special=False))
    assert len(r["completion_probabilities"]) == r["tokens_predicted"] - n_stop


def test_an_end_of_generation_token_is_stop_type_eos(server):
    eos = server.model.tokenizer.eos_id
    r = complete(server, n_predict=8, logit_bias=[[eos, 100]], id_slot=1)
    assert (r["stop_type"], r["content"], r["tokens_predicted"]) == ("eos", "", 0)
    slot = call(server.url + "/slots").json[1]
    assert r["id_slot"] == 1 and r["tokens_cached"] == slot["n_cached_tokens"]


def test_a_full_context_is_truncated(server):
    prompt = [100] * 500  # n_ctx 512
    r = complete(server, prompt=prompt, n_predict=-1, ignore_eos=True, cache_prompt=False)
    assert r["truncated"] is True and r["stop_type"] == "limit"
    # the context holds the prompt and every token but the last, sampled from its end
    assert r["tokens_evaluated"] + r["tokens_predicted"] == 512
    assert r["tokens_cached"] == 511


def test_a_prompt_over_the_context_is_exceed_context_size_error(server):
    prompt = [100] * 600
    for stream in (False, True):  # the first error of a stream is a plain answer
        answer = call(server.url + "/completion", {"prompt": prompt, "stream": stream})
        assert answer.status == 400 and answer.headers["content-type"] == "application/json"
        error = answer.json["error"]
        assert error["type"] == "exceed_context_size_error" and error["code"] == 400
        assert (error["n_prompt_tokens"], error["n_ctx"]) == (600, 512)
        assert "600" in error["message"]


def test_refusals_have_llama_servers_error_shape(server):
    answer = call(server.url + "/completion", {"prompt": PROMPT, "top_p": 2})
    error = answer.json["error"]
    assert answer.status == 400 and error["code"] == 400
    assert error["type"] == "invalid_request_error" and error["param"] == "top_p"
    refused = [("json_schema", {"type": "objectx"}), ("grammar", "root ::= x")]
    refused += [("response_fields", "content"), ("logit_bias", [[1]]), ("prompt", [[1.5]])]
    for name, value in refused:
        answer = call(server.url + "/completion", {"prompt": PROMPT, name: value})
        assert answer.status == 400 and answer.json["error"]["param"] == name, name
        assert answer.json["error"]["code"] == 400


def test_logit_bias_pairs_text_and_false(server):
    first = complete(server, n_predict=1, return_tokens=True)["tokens"][0]
    banned = complete(server, n_predict=4, logit_bias=[[first, False]], return_tokens=True)
    assert first not in banned["tokens"][:1]
    oai = openai_text(server, max_tokens=4, logit_bias={str(first): -100}).choices[0].text
    assert banned["content"] == oai
    assert complete(server, n_predict=4, logit_bias={str(first): -100})["content"] == oai
    assert banned["generation_settings"]["logit_bias"] == [{"bias": False, "token": first}]
    piece = server.model.tokenizer.token_to_piece(first)
    by_text = complete(server, n_predict=4, logit_bias=[[piece, -100]])
    assert by_text["content"] == oai


def test_seeded_sampling_matches_the_openai_route(server):
    kw = dict(temperature=0.9, seed=42, top_k=20)
    native = complete(server, n_predict=10, **kw)["content"]
    assert native == openai_text(server, max_tokens=10, **kw).choices[0].text
    two = complete(server, n_predict=10, n_cmpl=2, **kw)
    assert [r["content"] for r in two][0] == native and len(two) == 2


def test_response_fields_keep_and_lift_fields(server):
    r = complete(server, n_predict=3, response_fields=["content", "generation_settings/n_predict",
                                                       "prompt", "no_such_field"])  # fmt: skip
    assert set(r) == {"content", "generation_settings/n_predict", "prompt"}
    assert r["generation_settings/n_predict"] == 3 and r["prompt"] == PROMPT


def test_n_predict_zero_only_reads_the_prompt_into_the_cache(server):
    prompt = "A prompt read but not answered"
    r = complete(server, prompt=prompt, n_predict=0, id_slot=2, cache_prompt=False)
    assert (r["content"], r["tokens_predicted"], r["timings"]["predicted_n"]) == ("", 0, 0)
    assert r["tokens_cached"] == r["tokens_evaluated"] == n_tokens(server, prompt)
    again = complete(server, prompt=prompt, n_predict=1, id_slot=2)
    assert again["timings"]["cache_n"] == r["tokens_evaluated"] - 1


@pytest.mark.parametrize("reuse", [False, True])
def test_return_progress_streams_prompt_progress(server, reuse):
    prompt = [100 + i for i in range(150)]  # -b 64: three chunks
    body = {"prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True,
            "cache_prompt": reuse, "id_slot": 0}  # fmt: skip
    if reuse:
        call(server.url + "/completion", {**body, "stream": False})
    events = call(server.url + "/completion", body).events
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    first, last = progress[0], progress[-1]
    assert first["cache"] == first["processed"] == (149 if reuse else 0)
    assert last["processed"] == last["total"] == 150
    assert all(p["cache"] == first["cache"] for p in progress)
    assert all(
        a["processed"] < b["processed"] for a, b in zip(progress, progress[1:], strict=False)
    )
    assert len(progress) == (2 if reuse else 1 + math.ceil(150 / 64))
    assert events.index(next(e for e in events if e["tokens"])) == len(progress)
    assert all(e["content"] == "" and e["tokens"] == [] for e in events[: len(progress)])


def test_lora_scales_are_refused_as_no_adapter_is_loaded(server):
    plain = complete(server, n_predict=4)
    assert complete(server, n_predict=4, lora=[])["content"] == plain["content"]
    body = {"prompt": PROMPT, "lora": [{"id": 0, "scale": 1.0}]}
    answer = httpx.post(server.url + "/completion", json=body, timeout=60)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["code"] == 400 and error["param"] == "lora"
    assert "no LoRA adapter has id 0" in error["message"]

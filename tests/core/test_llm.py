"""tessera.LLM: its texts equal the engine's own generate for the same settings, and its
dicts validate as the ``openai`` package's types (Completion, ChatCompletion, chunks)."""

from __future__ import annotations

import numpy as np
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_choice import CompletionChoice

import tessera
from tessera.engine.context import Context, ContextParams
from tessera.engine.embed import Embedder
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import ContextOverflowError, TesseraError
from tessera.text.chat_template import ChatTemplate

PROMPT = "The for statement"
MESSAGES = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "What is a list?"},
]


class StreamedChoice(CompletionChoice):
    """A streamed completion's choice: OpenAI sends ``finish_reason`` null until the last
    chunk, which the non-streaming type does not allow; everything else is Completion's."""

    finish_reason: str | None = None  # type: ignore[assignment]


class StreamedCompletion(Completion):
    choices: list[StreamedChoice]  # type: ignore[assignment]


@pytest.fixture(scope="module")
def llm():
    with tessera.LLM(backend="numpy") as model:
        yield model


def _oracle(llm, tokens, n_predict, params, eog_ids=None):
    """The engine's generate on a fresh context, detokenized."""
    tok = llm.model.tokenizer
    ctx = Context(llm.model, ContextParams(n_ctx=llm.n_ctx))
    eog = tok.eog_ids if eog_ids is None else eog_ids
    ids = list(generate(ctx, tokens, n_predict, Sampler(params), eog_ids=eog))
    return tok.decode(ids), ids


def _chat_tokens(llm, messages):
    """The chat prompt built by hand from the model's template (not through LLM)."""
    tok = llm.model.tokenizer
    template = ChatTemplate(tok.chat_template, "", "")
    text = template.render(messages, add_generation_prompt=True)
    return tok.encode(text, add_special=True, parse_special=True)


GREEDY = SamplerParams(temperature=0.0)


def test_is_exported_from_the_package():
    from tessera.llm import LLM

    assert tessera.LLM is LLM and "LLM" in tessera.__all__


def test_complete_is_the_engines_greedy_generate(llm):
    got = llm.complete(PROMPT, max_tokens=12, temperature=0)
    text, ids = _oracle(llm, llm.model.tokenizer.encode(PROMPT), 12, GREEDY)
    Completion.model_validate(got)
    assert got["object"] == "text_completion" and got["model"] == "tessera-default.gguf"
    assert got["choices"][0]["text"] == text
    assert got["choices"][0]["finish_reason"] == ("length" if len(ids) == 12 else "stop")
    n_prompt = len(llm.model.tokenizer.encode(PROMPT))
    assert got["usage"] == {
        "prompt_tokens": n_prompt,
        "completion_tokens": len(ids),
        "total_tokens": n_prompt + len(ids),
    }


def test_seeded_sampling_is_the_engines_with_the_same_seed(llm):
    kw = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "min_p": 0.02, "repeat_penalty": 1.1}
    got = llm.complete("Python is", max_tokens=16, seed=1234, **kw)
    params = SamplerParams(
        temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, repeat_penalty=1.1, seed=1234
    )
    text, _ = _oracle(llm, llm.model.tokenizer.encode("Python is"), 16, params)
    assert got["choices"][0]["text"] == text


def test_token_ids_are_a_prompt_too(llm):
    ids = llm.tokenize(PROMPT)
    assert (
        llm.complete(ids, max_tokens=6, temperature=0)["choices"][0]["text"]
        == _oracle(llm, ids, 6, GREEDY)[0]
    )


def test_chat_is_the_engines_generate_on_the_rendered_template(llm):
    got = llm.chat(MESSAGES, max_tokens=16, temperature=0)
    ChatCompletion.model_validate(got)
    text, ids = _oracle(llm, _chat_tokens(llm, MESSAGES), 16, GREEDY)
    assert got["object"] == "chat.completion"
    assert got["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert got["usage"]["prompt_tokens"] == len(_chat_tokens(llm, MESSAGES))
    assert got["usage"]["completion_tokens"] == len(ids)


def test_the_second_turn_of_a_chat_equals_a_fresh_run_on_the_whole_conversation(llm):
    first = llm.chat(MESSAGES, max_tokens=10, temperature=0)["choices"][0]["message"]
    turn_2 = [*MESSAGES, first, {"role": "user", "content": "And a tuple?"}]
    second = llm.chat(turn_2, max_tokens=10, temperature=0)
    assert (
        second["choices"][0]["message"]["content"]
        == _oracle(llm, _chat_tokens(llm, turn_2), 10, GREEDY)[0]
    )


def test_chat_stream_chunks_validate_and_join_to_the_answer(llm):
    whole = llm.chat(MESSAGES, max_tokens=12, temperature=0)
    chunks = list(llm.chat(MESSAGES, max_tokens=12, temperature=0, stream=True))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    joined = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert joined == whole["choices"][0]["message"]["content"]


def test_completion_stream_chunks_validate_and_join_to_the_text(llm):
    whole = llm.complete(PROMPT, max_tokens=12, temperature=0)
    chunks = list(llm.complete(PROMPT, max_tokens=12, temperature=0, stream=True))
    for chunk in chunks:
        StreamedCompletion.model_validate(chunk)
    Completion.model_validate(chunks[-1])  # the last chunk is a complete Completion
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert len(chunks) > 2


def test_stream_gives_chat_chunks_for_messages_and_completion_chunks_for_a_prompt(llm):
    chat_ids = _chat_tokens(llm, MESSAGES)
    chat_text = _oracle(llm, chat_ids, 10, GREEDY)[0]
    chunks = list(llm.stream(MESSAGES, max_tokens=10, temperature=0))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == chat_text
    prompt_ids = llm.tokenize(PROMPT)
    text = _oracle(llm, prompt_ids, 10, GREEDY)[0]
    for prompt in (PROMPT, prompt_ids):  # text, or token ids
        chunks = list(llm.stream(prompt, max_tokens=10, temperature=0))
        for chunk in chunks:
            StreamedCompletion.model_validate(chunk)
        assert "".join(c["choices"][0]["text"] for c in chunks) == text


def test_llama_cpp_pythons_method_names_answer_the_same(llm):
    # code written for llama-cpp-python's Llama calls these, with messages= as a keyword
    got = llm.create_chat_completion(messages=MESSAGES, max_tokens=8, temperature=0)
    ChatCompletion.model_validate(got)
    want = _oracle(llm, _chat_tokens(llm, MESSAGES), 8, GREEDY)[0]
    assert got["choices"][0]["message"]["content"] == want
    text = llm.create_completion(PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert text == _oracle(llm, llm.tokenize(PROMPT), 8, GREEDY)[0]


def test_a_stop_string_cuts_the_text_before_it(llm):
    full = llm.complete(PROMPT, max_tokens=16, temperature=0)["choices"][0]["text"]
    stop = full[5:8]
    got = llm.complete(PROMPT, max_tokens=16, temperature=0, stop=[stop, "never seen"])
    assert got["choices"][0]["text"] == full[: full.index(stop)]
    assert got["choices"][0]["finish_reason"] == "stop"
    streamed = llm.complete(PROMPT, max_tokens=16, temperature=0, stop=stop, stream=True)
    assert "".join(c["choices"][0]["text"] for c in streamed) == full[: full.index(stop)]


def test_an_end_of_generation_token_finishes_with_stop(llm, monkeypatch):
    tok = llm.model.tokenizer
    ids = tok.encode(PROMPT)
    _, greedy = _oracle(llm, ids, 4, GREEDY)
    eog = frozenset(tok.eog_ids | {greedy[2]})  # the third token now ends the answer
    monkeypatch.setattr(tok, "eog_ids", eog)
    got = llm.complete(PROMPT, max_tokens=4, temperature=0)
    text = got["choices"][0]["text"]
    assert text == _oracle(llm, ids, 4, GREEDY, eog)[0] == tok.decode(greedy[:2])
    assert got["choices"][0]["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == 2


def test_no_max_tokens_runs_until_the_context_is_full():
    with tessera.LLM(backend="numpy", n_ctx=24) as small:
        ids = small.tokenize(PROMPT)
        got = small.complete(PROMPT, max_tokens=None, temperature=0)
        text, generated = _oracle(small, ids, -1, GREEDY)
        assert got["choices"][0]["text"] == text
        if got["choices"][0]["finish_reason"] == "length":
            assert len(ids) + len(generated) == 24


def test_a_stream_left_open_is_closed_by_the_next_call(llm):
    stream = llm.complete("Python is", max_tokens=20, temperature=0, stream=True)
    next(stream), next(stream)
    got = llm.complete(PROMPT, max_tokens=8, temperature=0)
    assert got["choices"][0]["text"] == _oracle(llm, llm.tokenize(PROMPT), 8, GREEDY)[0]
    with pytest.raises(TesseraError, match="read a stream to its end"):
        list(stream)


def test_embed_is_the_embedders_vectors():
    with tessera.LLM(backend="numpy", pooling="mean") as emb:
        texts = ["a list holds items", "a tuple is fixed"]
        got = emb.embed(texts)
        oracle, _ = Embedder(emb.model, pooling="mean").embed_texts(texts)
        np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-6)
        assert got.shape == (2, oracle.shape[1])
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(emb.embed(texts[0]), oracle[0], rtol=1e-5, atol=1e-6)


def test_embed_with_a_model_that_pools_none_says_what_to_pass(llm):
    with pytest.raises(TesseraError, match="pooling='mean'"):
        llm.embed(["text"])


def test_tokenize_and_detokenize_are_the_tokenizers(llm):
    tok = llm.model.tokenizer
    assert llm.tokenize("Hello world") == tok.encode("Hello world")
    assert llm.detokenize(tok.encode("Hello world")) == tok.decode(tok.encode("Hello world"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.chat([]), "non-empty list of dicts"),
        (lambda m: m.chat([{"content": "no role"}]), "'role'"),
        (lambda m: m.complete(PROMPT, temperature=float("nan")), "temperature"),
        (lambda m: m.complete(PROMPT, stop=[""]), "stop strings"),
        (lambda m: m.complete("word " * 600, stream=True), "context holds"),
    ],
)
def test_bad_input_raises_one_clear_error_at_call_time(llm, call, message):
    with pytest.raises(TesseraError, match=message):
        call(llm)


def test_a_prompt_too_long_is_a_context_overflow(llm):
    with pytest.raises(ContextOverflowError):
        llm.complete("word " * 600)


def test_unknown_options_are_a_type_error_naming_them():
    with pytest.raises(TypeError, match="unknown option.*n_gpu_split.*it takes"):
        tessera.LLM(backend="numpy", n_gpu_split=10)


def test_a_closed_llm_refuses_work():
    with tessera.LLM(backend="numpy") as closing:
        closing.complete(PROMPT, max_tokens=2)
    with pytest.raises(TesseraError, match="closed"):
        closing.complete(PROMPT)
    with pytest.raises(TesseraError, match="closed"):
        closing.tokenize(PROMPT)
